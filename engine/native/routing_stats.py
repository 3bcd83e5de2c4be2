"""Routing statistics read from the engine's native counters (per context), as immutable numpy snapshots."""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np

from ..errors import EngineError
from . import lib as native


@dataclasses.dataclass(frozen=True)
class RoutingStats:
    picks_prompt: np.ndarray   # uint64 [n_layer_all, n_expert]
    picks_decode: np.ndarray   # uint64 [n_layer_all, n_expert]
    hits: np.ndarray           # uint64 [n_layer_all]  decode picks served by a resident expert
    misses: np.ndarray         # uint64 [n_layer_all]  decode picks computed in host memory
    ring: np.ndarray           # int32 [rows, 2 + k]: pos (prompt rows -pos-1), layer, k expert ids; oldest first

    @property
    def decode_picks(self) -> int:
        return int(self.picks_decode.sum())

    @property
    def hit_rate(self) -> float:
        """Share of decode expert picks served from slots."""
        h, m = int(self.hits.sum()), int(self.misses.sum())
        return h / (h + m) if h + m else 0.0

    def layer_hit_rate(self) -> np.ndarray:
        tot = (self.hits + self.misses).astype(np.float64)
        return np.divide(self.hits, tot, out=np.zeros_like(tot), where=tot > 0)


def regime(counts: np.ndarray) -> tuple[int, float]:
    """Routing regime of one layer's pick counts [n_expert]: distinct experts used, and the share of picks carried
    by the top 10 % of experts (uniform ~10 %, degenerate > 50 %)."""
    n_top = max(1, round(0.1 * counts.size))
    total = max(1, int(counts.sum()))
    return int((counts > 0).sum()), float(np.sort(counts)[::-1][:n_top].sum() / total)


def _bind() -> ctypes.CDLL:
    L = native.lib()
    if not native.hasattr_symbol(L, "llama_moeslots_stats_enable"):
        raise EngineError("the installed engine lacks native stats: rebuild with `moeslots engine build`")
    f = L.llama_moeslots_stats_read
    if f.argtypes is None:
        u64p, i32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int32)
        L.llama_moeslots_stats_enable.restype = ctypes.c_int32
        L.llama_moeslots_stats_enable.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        L.llama_moeslots_stats_batch.restype = None
        L.llama_moeslots_stats_batch.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_bool]
        L.llama_moeslots_stats_reset.restype = None
        L.llama_moeslots_stats_reset.argtypes = [ctypes.c_void_p]
        f.restype = ctypes.c_int64
        f.argtypes = [ctypes.c_void_p, u64p, u64p, u64p, u64p, i32p, ctypes.c_int64]
        L.llama_moeslots_weight_copy_bytes.restype = ctypes.c_uint64
        L.llama_moeslots_weight_copy_bytes.argtypes = []
    return L


def enable(ctx_ptr: int, ring_rows: int) -> None:
    rc = _bind().llama_moeslots_stats_enable(ctx_ptr, ring_rows)
    if rc != 0:
        raise EngineError(f"could not enable routing stats (code {rc})")


def disable(ctx_ptr: int) -> None:
    _bind().llama_moeslots_stats_enable(ctx_ptr, -1)


def mark_batch(ctx_ptr: int, pos0: int, n_tokens: int, prompt: bool) -> None:
    _bind().llama_moeslots_stats_batch(ctx_ptr, pos0, n_tokens, prompt)


def reset(ctx_ptr: int) -> None:
    _bind().llama_moeslots_stats_reset(ctx_ptr)


def weight_copy_bytes() -> int:
    """Model-weight bytes the scheduler copied between backends since load (all contexts)."""
    return int(_bind().llama_moeslots_weight_copy_bytes())


@dataclasses.dataclass(frozen=True)
class SchedTiming:
    """Where the scheduler's time went over `graphs` computed graphs (all contexts; patch 0006), per kind of split:
    the CPU's splits and the other backends' (the GPU's). wait: waiting for a backend before taking a split's inputs
    (before a CPU split: the GPU finishing the work queued before it); copy: copying the inputs; compute: the split's
    compute call (the computation itself on the CPU, the launch on a GPU). Microseconds, summed."""

    graphs: int
    cpu_splits: int
    gpu_splits: int
    cpu_wait_us: float
    cpu_copy_us: float
    cpu_compute_us: float
    gpu_wait_us: float
    gpu_copy_us: float
    gpu_launch_us: float

    def per_graph_ms(self) -> dict[str, float]:
        """Each field per graph (a 1-token decode graph is one token): times in ms (keys ..._ms), splits as counts."""
        n = max(1, self.graphs)
        return {f.name.replace("_us", "_ms"): getattr(self, f.name) / n / (1.0 if f.name.endswith("splits") else 1e3)
                for f in dataclasses.fields(self) if f.name != "graphs"}


def sched_timing(on: bool, reset: bool = True) -> SchedTiming | None:
    """Read the scheduler's clock (sums since the last reset), then start (on) or stop it; reset zeroes the sums.
    None when the engine has no such clock (built before patch 0006)."""
    L = native.lib()
    if not native.hasattr_symbol(L, "llama_moeslots_sched_timing"):
        return None
    f = L.llama_moeslots_sched_timing
    if f.argtypes is None:
        f.restype = None
        f.argtypes = [ctypes.c_bool, ctypes.POINTER(ctypes.c_double), ctypes.c_int32, ctypes.c_bool]
    out = (ctypes.c_double * 9)()
    f(on, out, 9, reset)
    v = list(out)
    return SchedTiming(int(v[0]), int(v[1]), int(v[2]), *v[3:])


def read(ctx_ptr: int, n_layer_all: int, n_expert: int, k: int, ring_rows: int) -> RoutingStats:
    L = _bind()
    pp = np.zeros((n_layer_all, n_expert), np.uint64)
    pd = np.zeros((n_layer_all, n_expert), np.uint64)
    hits = np.zeros(n_layer_all, np.uint64)
    misses = np.zeros(n_layer_all, np.uint64)
    ring = np.zeros((max(ring_rows, 0), 2 + k), np.int32)
    u64p, i32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int32)
    n = L.llama_moeslots_stats_read(ctx_ptr, pp.ctypes.data_as(u64p), pd.ctypes.data_as(u64p),
                                    hits.ctypes.data_as(u64p), misses.ctypes.data_as(u64p),
                                    ring.ctypes.data_as(i32p) if ring_rows > 0 else None, ring_rows)
    if n < 0:
        raise EngineError("routing stats are off for this context")
    return RoutingStats(pp, pd, hits, misses, ring[:n].copy())


def turn_rows(before: RoutingStats, after: RoutingStats, k: int, end: int) -> np.ndarray | None:
    """The ring rows one turn wrote (prompt rows of its new prompt part, then decode rows), read from the stats
    before and after it; None when it wrote none. MTP verify rows of rejected drafts are dropped by keeping the
    last row of each (pos, layer), and rows past the last shown token (`end`) too. Manual recording and the
    automatic profile both keep these."""
    total = lambda st: int(st.picks_prompt.sum() + st.picks_decode.sum()) // k  # noqa: E731
    n_new = min(total(after) - total(before), len(after.ring))
    if n_new <= 0:
        return None
    rows = after.ring[-n_new:]
    rows = rows[rows[:, 0] < end]
    key = rows[:, 0].astype(np.int64) * 4096 + rows[:, 1]
    _, last = np.unique(key[::-1], return_index=True)
    return rows[np.sort(len(key) - 1 - last)]
