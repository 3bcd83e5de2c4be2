"""Routing traces in the CSV format of the thecodacus/llama.cpp fork's `llama-moe-trace` (design §5).

One row per (position, layer): `pos,layer,id0,id1,...`; prompt rows have a negative pos; merging traces is
concatenation. Optional leading `# key=value` lines carry model facts (arch, n_layer, n_expert, k, model, tokens)
so a profile of another model is refused with a clear message. A header line `pos,layer,...` is accepted.
Writes are atomic (temp file + rename).

Compressed: a name ending in `.gz` (gzip) or `.xz` (xz) is the same CSV compressed, read and written as such.
Well-formed rows are parsed in one numpy call; anything else goes through the line-by-line parser, which names the
file and line of the first bad row. Binary: a name ending in `.npz` holds the same rows as numpy arrays
(`pos` int64, `layer` uint16, `ids` uint8 when the experts fit a byte, `meta` the facts as JSON; members LZMA-
compressed, which np.load reads); the routing donor's 48-layer traces (docs/profiles.md) are kept so in
profiles/data/.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import lzma
import re
import zipfile
import zlib
from pathlib import Path
from typing import IO, Callable, Iterable, Mapping

import numpy as np

MAX_ID = 1 << 20          # no MoE has a million experts: larger ids are corrupt input
MAX_LAYER = 4096


class TraceError(ValueError):
    """A trace file is unreadable, malformed or belongs to another model; the message says which and where."""


@dataclasses.dataclass(frozen=True)
class Trace:
    pos: np.ndarray                       # int64 [R]   (< 0: prompt rows)
    layer: np.ndarray                     # int32 [R]
    ids: np.ndarray                       # int32 [R, k]
    meta: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def k(self) -> int:
        return int(self.ids.shape[1])

    @property
    def n_rows(self) -> int:
        return int(self.pos.shape[0])

    @property
    def decode(self) -> np.ndarray:
        return self.pos >= 0

    @property
    def n_layer(self) -> int:
        """Layers as the model declares them (meta), else 1 + the highest layer seen."""
        if "n_layer" in self.meta:
            return int(self.meta["n_layer"])
        return int(self.layer.max()) + 1 if self.n_rows else 0

    @property
    def n_expert(self) -> int:
        if "n_expert" in self.meta:
            return int(self.meta["n_expert"])
        return int(self.ids.max()) + 1 if self.n_rows else 0

    @property
    def decode_tokens(self) -> int:
        """Decode tokens: rows of the first layer seen at pos >= 0 (each token has one row per MoE layer)."""
        if not self.n_rows:
            return 0
        d = self.decode
        if not d.any():
            return 0
        first = int(self.layer[d].min())
        return int((self.layer[d] == first).sum())

    def shape_text(self) -> str:
        return f"{self.n_layer} layers x {self.n_expert} experts, k={self.k}"


def from_ring(rows: np.ndarray, meta: Mapping[str, str] | None = None) -> Trace:
    """A trace from the engine's routing ring rows [pos, layer, id0..] (prompt rows already negative)."""
    return Trace(rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int32), rows[:, 2:].astype(np.int32),
                 dict(meta or {}))


def empty(k: int, meta: Mapping[str, str] | None = None) -> Trace:
    return Trace(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros((0, k), np.int32), dict(meta or {}))


def from_rows(rows: Iterable[tuple[int, int, Iterable[int]]], meta: Mapping[str, str] | None = None,
              k: int | None = None) -> Trace:
    pos, layer, ids = [], [], []
    for p, il, e in rows:
        pos.append(p)
        layer.append(il)
        ids.append(list(e))
    if not ids:
        return empty(k or 1, meta)
    return Trace(np.array(pos, np.int64), np.array(layer, np.int32), np.array(ids, np.int32), dict(meta or {}))


_OPENERS: dict[str, Callable[..., IO[str]]] = {".gz": gzip.open, ".xz": lzma.open}
_ROWS = re.compile(r"(?:-?\d+(?:,-?\d+)+\n)*")


def compression(path: Path) -> str | None:
    """"gz" or "xz" when the file name says the trace is compressed, else None."""
    suf = Path(path).suffix.lower()
    return suf[1:] if suf in _OPENERS else None


def _read_text(path: Path) -> str:
    opener = _OPENERS.get(path.suffix.lower())
    try:
        if opener is None:
            return path.read_text(encoding="utf-8")
        with opener(path, "rt", encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise TraceError(f"trace not found: {path}") from None
    except (OSError, UnicodeDecodeError, EOFError, zlib.error, lzma.LZMAError) as e:
        raise TraceError(f"cannot read trace {path}: {e}") from None


def _fast_rows(text: str) -> tuple[dict[str, str], np.ndarray] | None:
    """(meta, rows [R, 2 + k]) when every line is a `#` line, the header, blank or a well-formed row whose values
    are in range; None sends the text to the line-by-line parser (which then names the offending line)."""
    meta_lines, data = [], []
    for line in text.splitlines():
        if line.startswith("#"):
            meta_lines.append(line)
        elif line and not line.lower().startswith("pos,"):
            data.append(line)
    if not data or len({line.count(",") for line in data}) != 1:
        return None
    body = "\n".join(data) + "\n"
    if not _ROWS.fullmatch(body):
        return None
    width = data[0].count(",") + 1
    if width < 3:
        return None
    try:
        vals = np.array(body.replace("\n", ",").split(",")[:-1], dtype=np.int64)   # exact ints, no float parsing
    except (ValueError, OverflowError):
        return None
    if vals.size != len(data) * width:
        return None
    rows = vals.reshape(len(data), width)
    ids = rows[:, 2:]
    if (np.abs(rows[:, 0]) >= (1 << 40)).any() or (rows[:, 1] < 0).any() or (rows[:, 1] >= MAX_LAYER).any() or \
            (ids < 0).any() or (ids >= MAX_ID).any():
        return None
    meta: dict[str, str] = {}
    for line in meta_lines:
        for tok in line[1:].split():
            if "=" in tok:
                key, _, val = tok.partition("=")
                meta[key.strip()] = val.strip()
    return meta, rows


def _read_npz(path: Path) -> Trace:
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [n for n in ("pos", "layer", "ids", "meta") if n not in z.files]
            if missing:
                raise TraceError(f"{path}: not a trace (no '{missing[0]}' array)")
            pos, layer, ids, meta_s = z["pos"], z["layer"], z["ids"], str(z["meta"])
    except FileNotFoundError:
        raise TraceError(f"trace not found: {path}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise TraceError(f"cannot read trace {path}: {e}") from None
    try:
        meta = {str(k): str(v) for k, v in json.loads(meta_s).items()}
    except (ValueError, AttributeError):
        raise TraceError(f"{path}: the facts (meta) are not a JSON object") from None
    n = pos.shape[0] if pos.ndim == 1 else -1
    if not (pos.ndim == 1 and layer.shape == (n,) and ids.ndim == 2 and ids.shape[0] == n and ids.shape[1] >= 1
            and all(a.dtype.kind in "iu" for a in (pos, layer, ids))):
        raise TraceError(f"{path}: arrays pos {pos.shape}, layer {layer.shape}, ids {ids.shape} do not form rows")
    if n and ((np.abs(pos.astype(np.int64)) >= (1 << 40)).any() or (layer < 0).any() or (layer >= MAX_LAYER).any()
              or (ids < 0).any() or (ids >= MAX_ID).any()):
        raise TraceError(f"{path}: a position, layer or expert id is out of range")
    t = Trace(pos.astype(np.int64), layer.astype(np.int32), ids.astype(np.int32), meta) if n else \
        empty(ids.shape[1], meta)
    return _checked(path, t, meta)


def _npz_bytes(trace: Trace) -> bytes:
    """An .npz (np.load reads it) whose members are LZMA-compressed: half the size of np.savez_compressed's deflate
    on routing ids (1.4 -> 0.6 MB for 4,000 tokens x 48 layers x 8 ids, rows sorted)."""
    small = trace.n_rows == 0 or int(trace.ids.max()) < 256
    arrays: dict[str, np.ndarray] = {"pos": trace.pos.astype(np.int64), "layer": trace.layer.astype(np.uint16),
              "ids": trace.ids.astype(np.uint8 if small else np.int32),
              "meta": np.array(json.dumps(dict(trace.meta), sort_keys=True))}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_LZMA) as z:
        for name, a in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, a, allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))   # same trace, same bytes
            info.compress_type = zipfile.ZIP_LZMA
            z.writestr(info, member.getvalue())
    return buf.getvalue()


def read_csv(path: Path) -> Trace:
    """A trace file: CSV, CSV compressed (`.gz`, `.xz`) or binary (`.npz`). TraceError (one line naming the file)
    when it cannot be read, is malformed, or contradicts its own `#` facts."""
    path = Path(path)
    if path.suffix.lower() == ".npz":
        return _read_npz(path)
    text = _read_text(path)
    fast = _fast_rows(text)
    if fast is not None:
        fast_meta, rows = fast
        return _checked(path, Trace(rows[:, 0].copy(), rows[:, 1].astype(np.int32), rows[:, 2:].astype(np.int32),
                                    fast_meta), fast_meta)
    meta: dict[str, str] = {}
    pos: list[int] = []
    layer: list[int] = []
    ids: list[list[int]] = []
    k = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            for tok in line[1:].split():
                if "=" in tok:
                    key, _, val = tok.partition("=")
                    meta[key.strip()] = val.strip()
            continue
        if line.lower().startswith("pos,"):
            continue                                            # header
        parts = [p.strip() for p in line.split(",")]
        try:
            vals = [int(p) for p in parts]
        except ValueError:
            raise TraceError(f"{path}:{lineno}: not a trace row (want integers pos,layer,id0,...): "
                             f"{line[:60]!r}") from None
        if len(vals) < 3:
            raise TraceError(f"{path}:{lineno}: a row needs pos, layer and at least one expert id")
        if k is None:
            k = len(vals) - 2
        elif len(vals) - 2 != k:
            raise TraceError(f"{path}:{lineno}: {len(vals) - 2} expert ids, earlier rows have {k}")
        p, il, e = vals[0], vals[1], vals[2:]
        if not -(1 << 40) < p < (1 << 40):
            raise TraceError(f"{path}:{lineno}: position {p} out of range")
        if not 0 <= il < MAX_LAYER:
            raise TraceError(f"{path}:{lineno}: layer {il} out of range")
        if any(not 0 <= x < MAX_ID for x in e):
            raise TraceError(f"{path}:{lineno}: expert id out of range in {e}")
        pos.append(p)
        layer.append(il)
        ids.append(e)
    t = (Trace(np.array(pos, np.int64), np.array(layer, np.int32), np.array(ids, np.int32), meta) if ids
         else empty(int(meta.get("k", 1) or 1), meta))
    return _checked(path, t, meta)


def _checked(path: Path, t: Trace, meta: dict[str, str]) -> Trace:
    """t, after checking that its rows agree with its own `#` facts."""
    for key in ("n_expert", "n_layer", "k"):
        if key in meta:
            try:
                int(meta[key])
            except ValueError:
                raise TraceError(f"{path}: '# {key}={meta[key]}' is not a number") from None
    if t.n_rows:
        if "n_expert" in meta and int(t.ids.max()) >= int(meta["n_expert"]):
            raise TraceError(f"{path}: expert id {int(t.ids.max())} >= n_expert={meta['n_expert']}")
        if "n_layer" in meta and int(t.layer.max()) >= int(meta["n_layer"]):
            raise TraceError(f"{path}: layer {int(t.layer.max())} >= n_layer={meta['n_layer']}")
        if "k" in meta and int(meta["k"]) != t.k:
            raise TraceError(f"{path}: rows carry {t.k} ids, the header says k={meta['k']}")
    return t


def write_csv(trace: Trace, path: Path) -> None:
    """Compressed when the name ends in .gz or .xz, binary for .npz. Atomic: a crash, a full disk or an interrupt
    leaves the old file (or none), never half a profile; the file gets the permissions a plain open() would
    (moeslots.atomicfile). TraceError (one line) when it cannot be written."""
    from .. import atomicfile

    path = Path(path)
    kind = compression(path)
    try:
        with atomicfile.replace(path, "wb") as fh:
            if path.suffix.lower() == ".npz":
                fh.write(_npz_bytes(trace))
                return
            buf = io.StringIO()
            if trace.meta:
                buf.write("# " + " ".join(f"{k}={v}" for k, v in trace.meta.items() if " " not in str(v)) + "\n")
            buf.write("pos,layer," + ",".join(f"id{i}" for i in range(trace.k)) + "\n")
            block = np.column_stack([trace.pos, trace.layer, trace.ids]) if trace.n_rows else np.zeros((0, 2))
            np.savetxt(buf, block, fmt="%d", delimiter=",")
            data = buf.getvalue().encode("utf-8")
            if kind == "gz":
                data = gzip.compress(data, compresslevel=9, mtime=0)          # mtime 0: the same trace, the same bytes
            elif kind == "xz":
                data = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
            fh.write(data)
    except OSError as e:
        kept = " (the old file is kept)" if path.is_file() else ""
        raise TraceError(f"cannot write {path}: {e.strerror or e}{kept}") from None


def check_compatible(a: Trace, b: Trace, what_a: str, what_b: str) -> None:
    """Same model shape, or a TraceError naming both shapes: the facts both declare agree, and neither holds a layer
    or an expert id beyond what the other declares (a file without `#` facts, the fork's, against one with them)."""
    def differ(why: str) -> TraceError:
        return TraceError(f"{what_a} ({a.shape_text()}, {a.meta.get('arch', '?')}) and {what_b} "
                          f"({b.shape_text()}, {b.meta.get('arch', '?')}) come from different models ({why})")

    for key in ("arch", "n_layer", "n_expert", "k"):
        va = a.meta.get(key) if key != "k" else str(a.k)
        vb = b.meta.get(key) if key != "k" else str(b.k)
        if va is not None and vb is not None and str(va) != str(vb):
            raise differ(key)
    for x, y, ny in ((a, b, what_b), (b, a, what_a)):
        if y.n_rows and "n_layer" in x.meta and int(y.layer.max()) >= x.n_layer:
            raise differ(f"{ny} routes layer {int(y.layer.max())}")
        if y.n_rows and "n_expert" in x.meta and int(y.ids.max()) >= x.n_expert:
            raise differ(f"{ny} routes expert {int(y.ids.max())}")


def merge(traces: list[Trace], names: list[str]) -> Trace:
    """Concatenation (design §5), after checking that every input comes from the same model."""
    if not traces:
        raise TraceError("nothing to merge")
    for t, n in zip(traces[1:], names[1:]):
        check_compatible(traces[0], t, names[0], n)
    meta = dict(traces[0].meta)
    meta.pop("tokens", None)
    meta["tokens"] = str(sum(t.decode_tokens for t in traces))
    return Trace(np.concatenate([t.pos for t in traces]), np.concatenate([t.layer for t in traces]),
                 np.concatenate([t.ids for t in traces]), meta)
