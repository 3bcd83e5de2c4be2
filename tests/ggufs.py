"""Small GGUF files with real headers and tensors, written by the tests (model discovery, the picker)."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import gguf
import numpy as np


def write_moe(path: Path, *, arch: str = "qwen3moe", n_expert: int = 8, k: int = 2, layers: tuple[int, ...] = (0, 1),
              n_block: int = 2, vocab: int = 0, dense: bool = False, split: tuple[int, int] | None = None) -> Path:
    """A small GGUF with real headers and tensors: expert tensors of `layers` (8 x 4 x 4 f32 each) and an
    attention tensor per layer; vocab: a token list that long (a big header)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(path.stem)
    w.add_block_count(n_block)
    if not dense:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(k)
    if split:
        w.add_uint16("split.no", split[0])
        w.add_uint16("split.count", split[1])
    if vocab:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}".encode() for i in range(vocab)])
    for il in layers:
        w.add_tensor(f"blk.{il}.attn_q.weight", np.zeros((4, 4), np.float32))
        if not dense:
            for name in ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"):
                w.add_tensor(f"blk.{il}.{name}.weight", np.ones((n_expert, 4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- single-value corruptions of a GGUF header (tests/engine/test_validate.py, the hypothesis fuzz) -----------------

_FMT = {gguf.GGUFValueType.UINT8: "<B", gguf.GGUFValueType.INT8: "<b", gguf.GGUFValueType.UINT16: "<H",
        gguf.GGUFValueType.INT16: "<h", gguf.GGUFValueType.UINT32: "<I", gguf.GGUFValueType.INT32: "<i",
        gguf.GGUFValueType.FLOAT32: "<f", gguf.GGUFValueType.BOOL: "<?", gguf.GGUFValueType.UINT64: "<Q",
        gguf.GGUFValueType.INT64: "<q", gguf.GGUFValueType.FLOAT64: "<d"}


@dataclasses.dataclass(frozen=True)
class Slot:
    """One value in a GGUF header that can be overwritten in place: a scalar, a string's bytes (same length), or
    one element of a number array."""
    key: str
    fmt: str            # struct format of the value; "s" for string bytes
    offset: int         # byte offset of the value in the file
    size: int           # bytes (strings: their length)
    value: object       # the value as written


def slots(path: Path) -> list[Slot]:
    """Every overwritable value of path's key/values (GGUF.* counts and array lengths excluded: structure, not
    values). Number arrays contribute their first, middle and last element."""
    r = gguf.GGUFReader(str(path))
    base = r.data.ctypes.data
    out = []
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.STRING:
            part = f.parts[f.data[0]]
            out.append(Slot(f.name, "s", int(part.ctypes.data - base), int(part.size), bytes(part)))
        elif t in _FMT:
            part = f.parts[f.data[0]]
            out.append(Slot(f.name, _FMT[t], int(part.ctypes.data - base), struct.calcsize(_FMT[t]), part[0].item()))
        elif t == gguf.GGUFValueType.ARRAY and len(f.types) > 1 and f.types[1] in _FMT and f.data:
            for i in sorted({0, len(f.data) // 2, len(f.data) - 1}):
                part = f.parts[f.data[i]]
                out.append(Slot(f"{f.name}[{i}]", _FMT[f.types[1]], int(part.ctypes.data - base),
                                struct.calcsize(_FMT[f.types[1]]), part[0].item()))
    return out


def find_slot(path: Path, key: str) -> Slot:
    return next(s for s in slots(path) if s.key == key)


def write_with(src: Path, dst: Path, slot: Slot, value: object) -> Path:
    """A copy of src with one value replaced (same type, same place: every other byte as in src)."""
    data = bytearray(src.read_bytes())
    if slot.fmt == "s":
        raw = value.encode() if isinstance(value, str) else bytes(value)  # type: ignore[arg-type]
        assert len(raw) == slot.size, "a string is replaced by one of the same length"
        data[slot.offset:slot.offset + slot.size] = raw
    else:
        struct.pack_into(slot.fmt, data, slot.offset, value)
    dst.write_bytes(bytes(data))
    return dst
