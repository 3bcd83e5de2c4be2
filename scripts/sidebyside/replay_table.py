"""Routing tables for llama.cpp b11549's replay hook (scripts/sidebyside/patches/0002), written from the same
routing `moeslots bench repick --replay` replays, so both engines decode the same experts token by token.

The file (`LLAMA_MOE_REPLAY=FILE llama-bench ...`): four little-endian int32 — magic b"MRP1", rows, layers, k — then
the expert ids, int32 [rows][layers][k]. The token at position p in model layer il takes row p % rows, layer
il % layers (the mapping of our engine's patch 0004).

Rows: `moeslots bench repick` plans its slots from the first `--profile-rows` decode rows of the routing, sets the
rows after them as its replay table and times positions 16.. (rows 0..15 are its prompt and warm-up). The table
written here starts at that first timed row, so llama-bench's tests (positions 0..) replay the rows moeslots times.
Layers: one column per model block; block il holds the routing's column il % its columns, as our engine reads it.

    replay_table.py facts MODEL.gguf [--slots 32,64]          # JSON: shape, slab bytes, cache MiB per slot count
    replay_table.py write MODEL.gguf ROUTING OUT.bin [--profile-rows 1024] [--rows 512]
    replay_table.py show FILE.bin

ROUTING: a trace moeslots reads (profiles/data/*.csv|npz, see moeslots.profiles.trace) or `uniform` (the uniform
random rows `bench repick --replay uniform` replays: same seed, same slice).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import struct
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

MAGIC = b"MRP1"
HEADER = struct.Struct("<4siii")
WARM_ROWS = 16            # bench repick: rows 0..11 prompt, 12..15 warm-up, then the timed decode
UNIFORM_SEED = 7          # bench repick's seed for --replay uniform


class TableError(ValueError):
    """A routing table or its input is unusable; the message says which file and why."""


def write_table(path: Path, ids: np.ndarray) -> None:
    """Write ids [rows, layers, k] (non-negative ints) as a replay table file."""
    a = np.asarray(ids)
    if a.ndim != 3 or 0 in a.shape:
        raise TableError(f"{path}: ids must be [rows, layers, k] with no empty axis, not {a.shape}")
    if a.dtype.kind not in "iu" or int(a.min()) < 0 or int(a.max()) >= 1 << 31:
        raise TableError(f"{path}: ids must be integers in [0, 2^31)")
    rows, layers, k = (int(x) for x in a.shape)
    if rows >= 1 << 31:
        raise TableError(f"{path}: {rows} rows do not fit the header")
    data = HEADER.pack(MAGIC, rows, layers, k) + np.ascontiguousarray(a, dtype="<i4").tobytes()
    tmp = Path(f"{path}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def read_table(path: Path) -> np.ndarray:
    """The ids [rows, layers, k] (int32) of a replay table file."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise TableError(f"cannot read {path}: {e.strerror or e}") from None
    if len(raw) < HEADER.size:
        raise TableError(f"{path}: not a routing table (too short)")
    magic, rows, layers, k = HEADER.unpack_from(raw)
    if magic != MAGIC or min(rows, layers, k) <= 0:
        raise TableError(f"{path}: not a routing table (magic {magic!r}, shape {rows}x{layers}x{k})")
    if len(raw) != HEADER.size + 4 * rows * layers * k:
        raise TableError(f"{path}: {len(raw)} bytes, the header says {HEADER.size + 4 * rows * layers * k}")
    ids = np.frombuffer(raw, dtype="<i4", offset=HEADER.size).reshape(rows, layers, k).astype(np.int32)
    if (ids < 0).any():
        raise TableError(f"{path}: negative expert id")
    return ids


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the side-by-side needs from a model's header."""
    path: str
    arch: str
    n_block: int              # blocks (trunk + NextN): the table's layers
    n_layer: int              # trunk blocks
    moe_layers: int           # trunk blocks with experts (the ones that get slots)
    n_expert: int
    k: int
    n_embd: int
    expert_ff: int
    slab_bytes: int           # one expert of one layer (gate + up + down)
    expert_bytes: int         # every expert tensor
    file_bytes: int

    def cache_mib(self, slots: int) -> int:
        """llama.cpp's --moe-cache-mib holding `slots` experts per MoE layer (what moeslots allocates), rounded up."""
        return -(-slots * self.slab_bytes * self.moe_layers // (1 << 20))

    def shape_text(self) -> str:
        return (f"{self.arch}, {self.n_layer} layers ({self.moe_layers} MoE), {self.n_expert} experts, {self.k} used, "
                f"n_embd {self.n_embd}, expert ff {self.expert_ff}; {self.slab_bytes / 1e6:.3f} MB per expert slab, "
                f"experts {self.expert_bytes / 2**20:.0f} MiB of {self.file_bytes / 2**20:.0f} MiB")


def model_facts(path: Path) -> Facts:
    from moeslots.engine.llm import ggufhead
    from moeslots.engine.machine import discovery

    info = discovery.describe(discovery.Found(Path(path), "", Path(path).name))
    if info.error:
        raise TableError(f"{path}: {info.error}")
    h = ggufhead.read_header(Path(path))
    a = info.arch
    return Facts(str(path), a, int(h.get(f"{a}.block_count", info.n_layer)), info.n_layer, info.moe_layers,
                 info.n_expert, info.k, int(h.get(f"{a}.embedding_length", 0) or 0),
                 int(h.get(f"{a}.expert_feed_forward_length", 0) or 0), info.slab_bytes, info.expert_bytes,
                 info.size)


def routing_rows(routing: str, facts: Facts, *, profile_rows: int, n_decode: int) -> tuple[np.ndarray, str]:
    """The decode rows [rows, columns, k] `bench repick --replay ROUTING` builds for this model (engine.replay:
    the trace mapped onto the model's experts, or its uniform rows), and their description."""
    from moeslots.engine.errors import EngineError
    from moeslots.engine.native import replay

    try:
        if routing == "uniform":
            t = replay.uniform(profile_rows + n_decode + WARM_ROWS, facts.moe_layers, facts.n_expert, facts.k,
                               seed=UNIFORM_SEED)
        else:
            t = replay.from_trace(Path(routing), facts.n_expert, facts.k)
    except EngineError as e:
        raise TableError(str(e)) from None
    return t.ids, t.source


def table_for(ids: np.ndarray, n_block: int, *, skip: int, rows: int) -> np.ndarray:
    """rows table rows from ids [R, C, k] starting at row `skip` (wrapping around the end), one column per model
    block: block il gets column il % C."""
    if ids.shape[0] <= skip:
        raise TableError(f"the routing has {ids.shape[0]} decode rows, fewer than the {skip} the plan and warm-up "
                         "take")
    take = ids[skip:skip + rows]
    cols = [il % ids.shape[1] for il in range(n_block)]
    return np.ascontiguousarray(take[:, cols], dtype=np.int32)


def cmd_facts(a: argparse.Namespace) -> int:
    f = model_facts(Path(a.model))
    out: dict[str, Any] = dataclasses.asdict(f)
    out["shape"] = f.shape_text()
    if a.slots:
        out["cache_mib"] = {str(s): f.cache_mib(s) for s in _ints(a.slots)}
    print(json.dumps(out))
    return 0


def cmd_write(a: argparse.Namespace) -> int:
    f = model_facts(Path(a.model))
    ids, source = routing_rows(a.routing, f, profile_rows=a.profile_rows, n_decode=a.n_decode)
    skip = a.profile_rows + WARM_ROWS
    table = table_for(ids, f.n_block, skip=skip, rows=a.rows)
    write_table(Path(a.out), table)
    print(f"{a.out}: {table.shape[0]} rows x {table.shape[1]} layers x {table.shape[2]} ids from {source}, "
          f"rows {skip}..{skip + table.shape[0] - 1}")
    return 0


def cmd_show(a: argparse.Namespace) -> int:
    t = read_table(Path(a.file))
    print(f"{a.file}: {t.shape[0]} rows x {t.shape[1]} layers x {t.shape[2]} ids, max id {int(t.max())}")
    print("row 0:", " | ".join(",".join(str(int(x)) for x in col) for col in t[0]))
    return 0


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TableError(f"not a comma-separated list of integers: {text!r}") from None
    if not vals or min(vals) < 0:
        raise TableError(f"not a list of counts >= 0: {text!r}")
    return vals


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="replay_table.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    fa = sub.add_parser("facts", help="the model's shape and cache sizes as JSON")
    fa.add_argument("model")
    fa.add_argument("--slots", help="slot counts to convert to --moe-cache-mib")
    fa.set_defaults(func=cmd_facts)
    w = sub.add_parser("write", help="write a routing table for LLAMA_MOE_REPLAY")
    w.add_argument("model")
    w.add_argument("routing", help="a trace (csv/npz) or 'uniform'")
    w.add_argument("out")
    w.add_argument("--profile-rows", type=int, default=1024, help="as bench repick's --profile-rows")
    w.add_argument("-n", "--n-decode", type=int, default=128, help="as bench repick's -n (uniform: rows made)")
    w.add_argument("--rows", type=int, default=512, help="table rows (llama-bench's longest test; more wrap)")
    w.set_defaults(func=cmd_write)
    s = sub.add_parser("show", help="shape and first row of a table")
    s.add_argument("file")
    s.set_defaults(func=cmd_show)
    a = p.parse_args(argv)
    try:
        return int(a.func(a))
    except TableError as e:
        print(f"replay_table.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
