"""A fast reader of a GGUF file's header only: its key/values and tensor infos, never the tensor data.

gguf.GGUFReader parses every array element into Python objects: ~8 s for the header of a 150k-token vocabulary on a
busy 2-core machine. Listing models (`moeslots models`, the app's picker) and keying a model's saved profile need
only the scalars and the tensor sizes, so arrays are skipped (their lengths kept) and the walk stays in bytes.
"""

from __future__ import annotations

import dataclasses
import mmap
import re
import struct
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
MAX_HEADER = 1 << 30            # a header larger than this is corrupt input, not a model
SMALL_ARRAY = 64                # number arrays up to this long are kept (rope sections, small per-layer counts)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


class HeaderError(ValueError):
    """Not a GGUF file, or a damaged header; the message says which."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    nbytes: int
    offset: int = 0               # in the data section


@dataclasses.dataclass(frozen=True)
class Header:
    version: int
    meta: dict[str, Any]          # scalars and strings; an array is kept as its length (int) under key + "#len"
    tensors: tuple[TensorInfo, ...]
    end: int                      # bytes the header takes (magic to the end of the tensor infos)
    arrays: dict[str, tuple] = dataclasses.field(default_factory=dict)   # number arrays of <= SMALL_ARRAY elements

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key, default)

    @property
    def data_end(self) -> int:
        """The file size its tensors need: the data section (after the header, aligned) to the last tensor's end."""
        align = int(self.get("general.alignment", 32) or 32)
        start = -(-self.end // align) * align
        return start + max((t.offset + t.nbytes for t in self.tensors), default=0)


def _type_sizes() -> dict[int, tuple[int, int]]:
    from gguf.constants import GGML_QUANT_SIZES

    return {int(t): v for t, v in GGML_QUANT_SIZES.items()}


class _Cursor:
    def __init__(self, buf: Any, limit: int):
        self.buf, self.off, self.limit = buf, 0, limit

    def take(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        if self.off + n > self.limit:
            raise HeaderError("the header ends early (truncated file?)")
        v = struct.unpack_from(fmt, self.buf, self.off)[0]
        self.off += n
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if n > self.limit - self.off:
            raise HeaderError(f"a string of {n} bytes at offset {self.off} runs past the file")
        s = bytes(self.buf[self.off:self.off + n])
        self.off += n
        return s.decode("utf-8", "replace")

    def skip_strings(self, count: int) -> None:
        buf, off, limit = self.buf, self.off, self.limit
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if off + 8 > limit:
                raise HeaderError("a string array runs past the file")
            off += 8 + unpack(buf, off)[0]
        if off > limit:
            raise HeaderError("a string array runs past the file")
        self.off = off

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR:
            return self.take(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        raise HeaderError(f"unknown value type {vtype} at offset {self.off}")


def read_header(path: Path) -> Header:
    """The header of a GGUF file; HeaderError when it is not one or is damaged."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if size < 24:
                raise HeaderError(f"{path}: too short to be a GGUF file ({size} bytes)")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, min(size, MAX_HEADER), path)
    except OSError as e:
        raise HeaderError(f"cannot read {path}: {e.strerror or e}") from None
    except HeaderError as e:
        msg = str(e)
        raise HeaderError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


def _parse(buf: Any, limit: int, path: Path) -> Header:
    if bytes(buf[:4]) != MAGIC:
        raise HeaderError(f"{path}: not a GGUF file (it starts with {bytes(buf[:4])!r})")
    c = _Cursor(buf, limit)
    c.off = 4
    version = c.take("<I")
    if version not in (2, 3):
        raise HeaderError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    if n_tensors > 1 << 20 or n_kv > 1 << 20:
        raise HeaderError(f"{path}: {n_tensors} tensors / {n_kv} keys: a damaged header")
    meta: dict[str, Any] = {}
    arrays: dict[str, tuple] = {}
    for _ in range(n_kv):
        key = c.string()
        vtype = c.take("<I")
        if vtype == _ARRAY:
            etype, count = c.take("<I"), c.take("<Q")
            if etype == _STRING:
                c.skip_strings(count)
            elif etype in _SCALAR:
                n = struct.calcsize(_SCALAR[etype]) * count
                if c.off + n > limit:
                    raise HeaderError(f"{path}: array {key} runs past the file")
                if count <= SMALL_ARRAY:
                    arrays[key] = struct.unpack_from("<" + _SCALAR[etype][1] * count, buf, c.off)
                c.off += n
            else:
                raise HeaderError(f"{path}: array {key} has element type {etype}")
            meta[key + "#len"] = count
        else:
            meta[key] = c.value(vtype)
    sizes = _type_sizes()
    tensors = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.take("<I")
        if n_dims > 8:
            raise HeaderError(f"{path}: tensor {name} has {n_dims} dimensions")
        shape = tuple(c.take("<Q") for _ in range(n_dims))
        gtype = c.take("<I")
        offset = c.take("<Q")                          # in the data section
        block, type_size = sizes.get(gtype, (0, 0))
        n_el = 1
        for d in shape:
            n_el *= d
        tensors.append(TensorInfo(name, shape, gtype, n_el // block * type_size if block else 0, offset))
    return Header(version, meta, tuple(tensors), c.off, arrays)


def shard_paths(path: Path) -> list[Path]:
    """All files of a split model (NAME-00001-of-0000N.gguf), in order; [path] when it is not split."""
    m = SPLIT_RE.match(path.name)
    if not m:
        return [path]
    n = int(m.group("n"))
    return [path.with_name(f"{m.group('stem')}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
