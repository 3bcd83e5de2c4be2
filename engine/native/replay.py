"""Routing replay for benchmarks: make the engine route token position p through recorded (or uniform random)
expert ids instead of the router's choice, keeping the router's weights for those ids. Synthetic random weights
have no temporal locality, so policy comparisons replay real traces. Never used by chat."""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import numpy as np

from ...profiles.simulate import token_matrix
from ...profiles.trace import TraceError, read_csv
from ..errors import EngineError
from . import lib as native


@dataclasses.dataclass(frozen=True)
class ReplayTable:
    ids: np.ndarray        # int32 [n_rows, n_layer, k]
    source: str            # what it is, printed by benchmarks ("uniform random", "trace X.csv (n tokens)")

    @property
    def n_rows(self) -> int:
        return int(self.ids.shape[0])

    def per_layer(self, layers: "list[int]") -> np.ndarray:
        """ids [n_rows, len(layers), k] as the engine replays them: model layer il takes column il % n_columns
        (patch 0004's mapping, so a trace of fewer layers covers a deeper model)."""
        return self.ids[:, [il % self.ids.shape[1] for il in layers]]


def uniform(n_rows: int, n_layer: int, n_expert: int, k: int, seed: int = 0) -> ReplayTable:
    """k distinct experts per (row, layer), uniformly at random: no locality at all."""
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((n_rows, n_layer, n_expert)), axis=2)[:, :, :k].astype(np.int32)
    return ReplayTable(ids, f"uniform random ({n_rows} rows)")


def from_trace(path: Path, n_expert: int, k: int) -> ReplayTable:
    """The decode tokens of a design-§5 trace CSV (grouped by position, see profiles.simulate.token_matrix), mapped
    onto n_expert experts (id * n_expert // trace_experts), first k ids of each row."""

    try:
        tr = read_csv(Path(path))
        layers, table = token_matrix(tr)
    except TraceError as e:
        raise EngineError(f"{path}: {e}" if str(path) not in str(e) else str(e)) from None
    trace_experts = tr.n_expert
    if tr.k >= k:
        table = (table[:, :, :k].astype(np.int64) * n_expert // trace_experts).astype(np.int32)
        how = f"{trace_experts} experts mapped onto {n_expert}"
    elif k % tr.k == 0 and n_expert % (k // tr.k) == 0 and n_expert // (k // tr.k) >= trace_experts:
        # fewer ids per row than the model routes: split every trace expert into m = k / k_trace fine-grained
        # experts that are always picked together (k_trace=4 of 64 -> 8 of 128: e -> 2e, 2e+1), which keeps the
        # trace's locality and makes S slots of the model behave like S/m slots of the traced model
        m = k // tr.k
        base = table.astype(np.int64) * (n_expert // m) // trace_experts
        table = (base[:, :, :, None] * m + np.arange(m)).reshape(len(table), table.shape[1], k).astype(np.int32)
        how = f"each of {trace_experts} experts split into {m} of {n_expert} (k {tr.k} -> {k})"
    else:
        raise EngineError(f"{path}: {tr.k} experts per row over {trace_experts}; cannot map onto k={k} of "
                          f"{n_expert} (needs k to be a multiple of {tr.k})")
    return ReplayTable(table, f"trace {Path(path).name} ({len(table)} decode tokens, {len(layers)} layers, {how})")


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
