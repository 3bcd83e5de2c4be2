"""Routing replay for benchmarks: make the engine route token position p through recorded (or uniform random)
expert ids instead of the router's choice, keeping the router's weights for those ids. Synthetic random weights
have no temporal locality, so policy comparisons replay real traces. Never used by chat."""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import numpy as np

from moeslots.engine import native
from moeslots.engine.errors import EngineError


@dataclasses.dataclass(frozen=True)
class ReplayTable:
    ids: np.ndarray        # int32 [n_rows, n_layer, k]
    source: str            # what it is, printed by benchmarks ("uniform random", "trace X.csv (n tokens)")

    @property
    def n_rows(self) -> int:
        return int(self.ids.shape[0])


def uniform(n_rows: int, n_layer: int, n_expert: int, k: int, seed: int = 0) -> ReplayTable:
    """k distinct experts per (row, layer), uniformly at random: no locality at all."""
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((n_rows, n_layer, n_expert)), axis=2)[:, :, :k].astype(np.int32)
    return ReplayTable(ids, f"uniform random ({n_rows} rows)")


def from_trace(path: Path, n_expert: int, k: int) -> ReplayTable:
    """Decode rows of a design-§5 trace CSV (`pos,layer,id0,...`; '#' lines and a header are skipped), one row per
    token in file order, mapped onto n_expert experts (id * n_expert // trace_experts) and the first k ids."""
    rows: list[tuple[int, int, list[int]]] = []
    trace_experts = 0
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            if line.startswith("#") and "n_expert" in line:
                try:
                    trace_experts = int(line.split("n_expert", 1)[1].strip(" =:").split()[0].strip(","))
                except (ValueError, IndexError):
                    pass
            continue
        parts = line.split(",")
        try:
            vals = [int(x) for x in parts]
        except ValueError:
            continue                                   # header or malformed line
        if len(vals) < 3 or vals[0] < 0:
            continue                                   # prompt rows have negative pos
        rows.append((vals[0], vals[1], vals[2:]))
    if not rows:
        raise EngineError(f"{path}: no decode rows to replay")
    layers = sorted({r[1] for r in rows})
    k_trace = min(len(r[2]) for r in rows)
    if k_trace < k:
        raise EngineError(f"{path}: {k_trace} experts per row, the model routes {k}")
    trace_experts = trace_experts or (max(max(r[2]) for r in rows) + 1)
    lidx = {layer: i for i, layer in enumerate(layers)}
    tokens: list[np.ndarray] = []
    cur = None
    last_pos = None
    for pos, layer, ids in rows:
        if cur is None or pos != last_pos:
            if cur is not None:
                tokens.append(cur)
            cur = np.full((len(layers), k), -1, np.int32)
            last_pos = pos
        mapped = [e * n_expert // trace_experts for e in ids[:k]]
        cur[lidx[layer]] = mapped
    tokens.append(cur)
    table = np.stack(tokens)
    # a layer missing in some token's rows: reuse the previous token's ids for it
    for t in range(1, len(table)):
        miss = table[t, :, 0] < 0
        table[t, miss] = table[t - 1, miss]
    table = table[(table >= 0).all(axis=(1, 2))]
    return ReplayTable(table, f"trace {Path(path).name} ({len(table)} decode tokens, {len(layers)} layers, "
                              f"{trace_experts} experts mapped onto {n_expert})")


def set_replay(ctx_ptr: int, table: ReplayTable | None) -> None:
    L = native.lib()
    if not native.hasattr_symbol(L, "llama_moeslots_replay_set"):
        raise EngineError("the installed engine lacks routing replay: rebuild with `moeslots engine build`")
    f = L.llama_moeslots_replay_set
    if f.argtypes is None:
        f.restype = ctypes.c_int32
        f.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int64, ctypes.c_int32, ctypes.c_int32]
    if table is None:
        f(ctx_ptr, None, 0, 1, 1)
        return
    ids = np.ascontiguousarray(table.ids, dtype=np.int32)
    rc = f(ctx_ptr, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), ids.shape[0], ids.shape[1], ids.shape[2])
    if rc != 0:
        raise EngineError(f"routing replay refused (code {rc}): {native.recent_log(2).strip()}")
