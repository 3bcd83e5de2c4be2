"""The static expert cache from Python: slot plans and the patched engine's configure/clear calls.

A plan names, per MoE layer, the experts that live in VRAM ("slots"). The engine copies them once into a hot
pack on the layer's GPU; every other pick is computed where the experts live (host memory). Plans come from
profiles (moeslots.profiles) or, for tests and benchmarks, from the helpers below.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Mapping, Sequence

import numpy as np

from ...profiles.plan import elect
from ..errors import EngineError
from . import lib as native

ERR_INPUT, ERR_NO_MEMORY, ERR_UNSUPPORTED = -1, -2, -3
PACK_HOST = 1
SPARE = 2          # one more pack entry per layer: stage/commit (re-pick copies overlapping decoding)


class CacheError(EngineError):
    """The expert cache could not be configured (bad plan, does not fit, unsupported layer)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True)
class SlotPlan:
    """layer -> resident expert ids, in slot order. Layers not named hold no slots."""

    layers: Mapping[int, tuple[int, ...]]

    @property
    def total_slots(self) -> int:
        return sum(len(v) for v in self.layers.values())

    @property
    def slots_per_layer(self) -> int:
        """Slots of the first planned layer (plans made here give every layer the same count); 0 when empty."""
        return len(next(iter(self.layers.values()))) if self.layers else 0

    def slots_of(self, il: int) -> tuple[int, ...]:
        return tuple(self.layers.get(il, ()))

    @classmethod
    def uniform(cls, moe_layers: Sequence[int], n_slots: int, n_expert: int, *, offset: int = 0) -> "SlotPlan":
        """The same n_slots per layer: experts offset, offset+1, ... (mod n_expert). For tests and benchmarks."""
        if not 0 <= n_slots <= n_expert:
            raise CacheError(f"{n_slots} slots per layer: the model has {n_expert} experts", ERR_INPUT)
        return cls({il: tuple((offset + j) % n_expert for j in range(n_slots)) for il in moe_layers})


def _bind() -> ctypes.CDLL:
    L = native.lib()
    if not native.hasattr_symbol(L, "llama_moeslots_cache_configure"):
        raise EngineError("the installed engine lacks the expert cache patch: rebuild with `moeslots engine build`")
    f = L.llama_moeslots_cache_configure
    if f.argtypes is None:   # (restype defaults to c_int, which *is* c_int32: test the argtypes)
        f.restype = ctypes.c_int32
        f.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32), ctypes.c_int32,
                      ctypes.c_int32, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
        L.llama_moeslots_cache_clear.restype = None
        L.llama_moeslots_cache_clear.argtypes = [ctypes.c_void_p]
        L.llama_moeslots_cache_bytes.restype = ctypes.c_uint64
        L.llama_moeslots_cache_bytes.argtypes = [ctypes.c_void_p]
        i32, ptr = ctypes.c_int32, ctypes.c_void_p
        for name, restype, argtypes in (
                ("llama_moeslots_cache_swap", ctypes.c_int64, [ptr, i32, i32, i32]),
                ("llama_moeslots_cache_stage", ctypes.c_int64, [ptr, i32, i32]),
                ("llama_moeslots_cache_commit", i32, [ptr, i32, i32]),
                ("llama_moeslots_async_set", None, [ctypes.c_bool]),
                ("llama_moeslots_async_get", ctypes.c_bool, []),
                ("llama_moeslots_graph_splits", i32, [ptr]),
                ("llama_moeslots_cache_n_contexts", i32, [ptr])):
            getattr(L, name).restype = restype
            getattr(L, name).argtypes = argtypes
    return L


def configure(model_ptr: int, n_layer_all: int, plan: SlotPlan, *, pack_host: bool = False,
              max_bytes: int = 0, spare: bool = False) -> str:
    """Replace the model's cache with plan; returns the engine's load line. On error the cache is empty
    (the old pack is freed first) and CacheError carries the engine's message."""
    L = _bind()
    bad = [il for il in plan.layers if not 0 <= il < n_layer_all]
    if bad:
        raise CacheError(f"the plan names layer {bad[0]}, the model has layers 0..{n_layer_all - 1}", ERR_INPUT)
    counts = (ctypes.c_int32 * n_layer_all)(*[len(plan.slots_of(il)) for il in range(n_layer_all)])
    flat = [e for il in range(n_layer_all) for e in plan.slots_of(il)]
    ids = (ctypes.c_int32 * max(1, len(flat)))(*flat)
    msg = ctypes.create_string_buffer(512)
    flags = (PACK_HOST if pack_host else 0) | (SPARE if spare else 0)
    rc = L.llama_moeslots_cache_configure(model_ptr, counts, ids, n_layer_all, flags, max_bytes, msg, len(msg))
    text = msg.value.decode("utf-8", "replace")
    if rc != 0:
        raise CacheError(text or f"expert cache error {rc}", rc)
    return text


def swap(model_ptr: int, layer: int, slot: int, expert: int) -> int:
    """Put `expert` into `slot` of `layer` (between decodes); returns the bytes copied."""
    f = _bind().llama_moeslots_cache_swap
    n = int(f(model_ptr, layer, slot, expert))
    if n < 0:
        raise CacheError(f"cannot put expert {expert} into slot {slot} of layer {layer} (code {n})", n)
    return n


def elect_swaps(plan: SlotPlan, ring: "np.ndarray", n_expert: int, *, max_swaps: int, window: int,
                margin: float) -> dict[int, list[tuple[int, int]]]:
    """One re-pick's election (profiles.plan.elect, the simulator's reelect rule) per layer of the plan, from the
    decode rows of the last `window` positions in the routing ring: {layer: [(slot, new expert), ...]}."""

    ring = ring[ring[:, 0] >= 0]
    if not len(ring) or not plan.layers:
        return {}
    recent = ring[ring[:, 0] > int(ring[:, 0].max()) - window]
    ids = recent[:, 2:]
    ok = (ids >= 0) & (ids < n_expert)
    layer = np.broadcast_to(recent[:, 1:2], ids.shape)
    n_layer = int(max(max(plan.layers), int(recent[:, 1].max()))) + 1
    counts = np.bincount((layer[ok] * n_expert + ids[ok]).astype(np.int64),
                         minlength=n_layer * n_expert).reshape(n_layer, n_expert).astype(np.float64)
    return {il: elect(counts[il], slots, max_swaps, margin) for il, slots in plan.layers.items()}


def repick(model_ptr: int, plan: SlotPlan, ring: "np.ndarray", n_expert: int, *, max_swaps: int, window: int,
           margin: float) -> tuple[SlotPlan, int, int]:
    """One re-pick, copies done now (between decodes): elect, then swap only the changed slabs.
    Returns (new plan, swaps, bytes copied); the same plan object when the ring had nothing to elect from."""
    swaps_of = elect_swaps(plan, ring, n_expert, max_swaps=max_swaps, window=window, margin=margin)
    if not swaps_of:
        return plan, 0, 0
    layers = dict(plan.layers)
    moved = swaps = 0
    for il, swaps_il in swaps_of.items():
        new = list(layers[il])
        for slot, e in swaps_il:
            moved += swap(model_ptr, il, slot, e)
            new[slot] = e
            swaps += 1
        layers[il] = tuple(new)
    return SlotPlan(layers), swaps, moved


def stage(model_ptr: int, layer: int, expert: int) -> int:
    """Copy a non-resident expert into the layer's spare pack entry (packs configured with spare=True). Safe to run
    on another thread while the model's contexts decode; not while the cache is configured, swapped or committed.
    Returns the bytes copied."""
    f = _bind().llama_moeslots_cache_stage
    n = int(f(model_ptr, layer, expert))
    if n < 0:
        raise CacheError(f"cannot stage expert {expert} of layer {layer} (no spare entry, resident already, or a "
                         f"stage in progress; code {n})", n)
    return n


def commit(model_ptr: int, layer: int, slot: int) -> None:
    """Between decodes: the staged expert becomes the resident of `slot` (no copy: the maps move)."""
    f = _bind().llama_moeslots_cache_commit
    rc = int(f(model_ptr, layer, slot))
    if rc != 0:
        raise CacheError(f"nothing staged to commit into slot {slot} of layer {layer} (code {rc})", rc)


def graph_splits(ctx_ptr: int) -> int:
    """Backend runs (splits) of the context's last computed graph; each boundary is a synchronisation."""
    return int(_bind().llama_moeslots_graph_splits(ctx_ptr))


def n_contexts(model_ptr: int) -> int:
    """Contexts that ran a graph with the model's cache: swaps, commits and clears synchronise each first."""
    return int(_bind().llama_moeslots_cache_n_contexts(model_ptr))


def clear(model_ptr: int) -> None:
    _bind().llama_moeslots_cache_clear(model_ptr)


def pack_bytes(model_ptr: int) -> int:
    return int(_bind().llama_moeslots_cache_bytes(model_ptr))


def set_async(on: bool) -> None:
    """Overlap the host chain with the GPU chain (patch 0002; process-wide, default off).
    Contexts rebuild their graphs at their next decode."""
    _bind().llama_moeslots_async_set(bool(on))


def async_enabled() -> bool:
    return bool(_bind().llama_moeslots_async_get())


class Stager:
    """Re-pick copies that overlap decoding (patch 0005; packs configured with spare=True): `begin` takes a
    re-pick's swaps; one copy per layer at a time is staged on a worker thread; `poll`, called between decodes,
    commits the finished ones and starts the next, so a re-pick's swaps come in over the next tokens."""

    def __init__(self, model_ptr: int) -> None:
        import concurrent.futures

        self.model_ptr = model_ptr
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="moeslots-stage")
        self._job: "concurrent.futures.Future[list[tuple[int, int, int, int]]] | None" = None
        self.pending: dict[int, list[tuple[int, int]]] = {}

    @property
    def busy(self) -> bool:
        return bool(self.pending) or self._job is not None

    def begin(self, swaps_of: Mapping[int, Sequence[tuple[int, int]]]) -> None:
        if self.busy:
            raise CacheError("a re-pick's copies are still coming in", ERR_INPUT)
        self.pending = {il: list(v) for il, v in swaps_of.items() if v}
        self._start()

    def _start(self) -> None:
        jobs = [(il, *swaps[0]) for il, swaps in self.pending.items() if swaps]
        if not jobs:
            self.pending = {}
            return
        ptr = self.model_ptr
        self._job = self._pool.submit(lambda: [(il, slot, e, stage(ptr, il, e)) for il, slot, e in jobs])

    def poll(self, plan: SlotPlan, wait: bool = False) -> tuple[SlotPlan, int, int]:
        """Between decodes: commit what finished (waiting for it with wait=True). Returns (plan, swaps, bytes)."""
        job = self._job
        if job is None or not (wait or job.done()):
            return plan, 0, 0
        self._job = None
        try:
            done = job.result()
        except CacheError:
            self.pending = {}
            raise
        layers = dict(plan.layers)
        moved = 0
        for il, slot, e, nbytes in done:
            commit(self.model_ptr, il, slot)
            new = list(layers[il])
            new[slot] = e
            layers[il] = tuple(new)
            self.pending[il].pop(0)
            moved += nbytes
        self.pending = {il: v for il, v in self.pending.items() if v}
        self._start()
        return SlotPlan(layers), len(done), moved

    def drain(self) -> None:
        """Wait for a copy in flight and drop the rest (before a reconfigure)."""
        job, self._job = self._job, None
        if job is not None:
            try:
                job.result()
            except CacheError:
                pass
        self.pending = {}

    def close(self) -> None:
        self.drain()
        self._pool.shutdown(wait=True)
