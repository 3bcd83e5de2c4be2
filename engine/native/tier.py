"""The dynamic tier run by the engine itself (patch 0007; stepped on the GPU: patch 0008): per layer the plan's last
D slots follow the routing, and each miss of a decode token is computed on the CPU or uploaded into the tier now and
computed on the GPU in the same token, whichever this machine's costs say (profiles.hybrid's rule with the NATIVE
mechanism, stepped inside the graph: no Python between layers). This module binds the C calls and keeps the Python
view of it: the plan the cache holds (core + the tier's residents) and the per-token split (core / tier / uploaded /
CPU).

(The first tier was stepped from Python between tokens, its prefetches staged on a worker thread into a spare pack
entry and committed a token later; the simulator keeps that as the STAGED mechanism, a what-if.)
"""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np

from ...profiles.costs import CostModel
from ...profiles.split import rule_costs, share_costs
from . import lib as native
from .expert_cache import ERR_INPUT, CacheError, SlotPlan

DECAY = 0.95          # profiles.hybrid.Tier's default: the simulator's
TAKE_TIMEOUT_S = 60.0   # a fetch-split take waits microseconds for the GPU; this long, and the decode fails
_TIMEOUT_S: dict[int, float] = {}   # model -> the take timeout its GPU-stepped tier was set with


def _bind() -> ctypes.CDLL:
    L = native.lib()
    f = L.llama_moeslots_tier_set
    if f.argtypes is None:
        f.restype = ctypes.c_int32
        f.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_double, ctypes.c_double, ctypes.c_double]
        L.llama_moeslots_tier_counts.restype = None
        L.llama_moeslots_tier_counts.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int32,
                                                 ctypes.c_bool]
        L.llama_moeslots_tier_residents.restype = ctypes.c_int32
        L.llama_moeslots_tier_residents.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                                                    ctypes.c_int32]
        L.llama_moeslots_tier_set_device.restype = ctypes.c_int32
        L.llama_moeslots_tier_set_device.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_double, ctypes.c_double,
                                                     ctypes.c_double, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]
    return L


def set_tier(model_ptr: int, n_tier: int, cost: CostModel | None, decay: float = DECAY, *,
             device: bool = False, share: bool = False, take_timeout_s: float = TAKE_TIMEOUT_S) -> int:
    """Give every partly resident trunk layer a tier of its last n_tier slots (0: off). Returns the layers that got
    one. Between decodes only; the model's contexts rebuild their graphs at their next decode. device: the tier is
    stepped on the pack's device (patch 0008, `--policy fetch`): every miss fetched by the GPU from pinned memory,
    none computed on the CPU, no host round trip; with share (`--policy fetch-split`, needs cost) the GPU fetches
    only part of each layer's misses and the CPU computes the others beside its copies; a GPU that has not handed
    the CPU its inputs after take_timeout_s fails that decode (take_failed says where)."""
    if device:
        if share and cost is None:
            raise ValueError("a CPU share needs the machine's costs")
        t_cpu, t_up = share_costs(cost) if share and cost is not None else (0.0, 0.0)
        msg = ctypes.create_string_buffer(512)
        rc = int(_bind().llama_moeslots_tier_set_device(model_ptr, n_tier, t_cpu, t_up, decay,
                                                        max(1, round(1e3 * take_timeout_s)), msg, len(msg)))
        if n_tier > 0:
            _TIMEOUT_S[model_ptr] = take_timeout_s
        else:
            _TIMEOUT_S.pop(model_ptr, None)             # (no tier: no take can fail; a freed model's address reused)
        if rc < 0:
            why = msg.value.decode(errors="replace") or f"code {rc}"
            raise CacheError(f"the engine refused a GPU-stepped tier of {n_tier} slots per layer: {why}", rc)
        return rc
    t_cpu, t_up = rule_costs(cost) if cost is not None else (1.0, 1.0)
    rc = int(_bind().llama_moeslots_tier_set(model_ptr, n_tier, t_cpu, t_up, decay))
    if rc < 0:
        raise CacheError(f"the engine refused a tier of {n_tier} slots per layer (a layer with fewer slots, a re-pick "
                         f"copy in flight, or bad costs; code {rc})", rc)
    return rc


def set_worker(model_ptr: int, n_threads: int) -> int:
    """Have a worker of n_threads compute the CPU shares of the model's GPU-stepped tier (`--policy fetch-split`,
    patch 0010) outside the graph: a decode token is one GPU split, each layer's join waits in the GPU's queue for
    the worker's result and reads it in place (0: the graph's own CPU split computes them, as a new tier does). The
    logits are the same. Returns the layers served; between decodes only."""
    L = native.lib()
    if not native.hasattr_symbol(L, "llama_moeslots_tier_worker"):
        raise CacheError("this engine has no CPU share worker (patch 0010): rebuild it with `moeslots engine build`",
                         ERR_INPUT)
    f = L.llama_moeslots_tier_worker
    f.restype, f.argtypes = ctypes.c_int32, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]
    msg = ctypes.create_string_buffer(512)
    rc = int(f(model_ptr, n_threads, msg, len(msg)))
    if rc < 0:
        why = msg.value.decode(errors="replace") or f"code {rc}"
        raise CacheError(f"the engine refused a CPU share worker of {n_threads} threads: {why}", rc)
    return rc


@dataclasses.dataclass(frozen=True)
class WorkerStats:
    shares: int = 0             # layer shares computed
    wait_us: float = 0.0        # waiting for their stages (from the moment the worker turned to the layer)
    work_us: float = 0.0        # computing them

    def per_share(self) -> tuple[float, float]:
        """(us waiting, us computing) per layer share."""
        n = max(1, self.shares)
        return self.wait_us / n, self.work_us / n


def worker_stats(model_ptr: int, reset: bool = False) -> WorkerStats | None:
    """The model's worker since it started or was last read with reset (None: no worker)."""
    f = native.lib().llama_moeslots_tier_worker_stats
    f.restype = ctypes.c_int32
    f.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int32, ctypes.c_bool]
    out = (ctypes.c_uint64 * 3)()
    if int(f(model_ptr, out, 3, reset)) < 0:
        return None
    return WorkerStats(int(out[0]), out[1] / 1e3, out[2] / 1e3)


def take_failed(model_ptr: int) -> int | None:
    """After a decode failed: the first layer whose CPU share gave up waiting for the GPU, or None. Told once."""
    L = native.lib()
    if not native.hasattr_symbol(L, "llama_moeslots_tier_take_failed"):
        return None
    f = L.llama_moeslots_tier_take_failed
    f.restype, f.argtypes = ctypes.c_int32, [ctypes.c_void_p]
    il = int(f(model_ptr))
    return il if il >= 0 else None


def take_failure(model_ptr: int) -> str | None:
    """After a decode failed: why, when a fetch-split share gave up waiting for the GPU (else None)."""
    il = take_failed(model_ptr)
    if il is None:
        return None
    return (f"the GPU did not hand layer {il}'s inputs to the CPU's share of its experts within "
            f"{_TIMEOUT_S.get(model_ptr, TAKE_TIMEOUT_S):g} s (--policy fetch-split); the reply stopped there "
            f"(--policy fetch leaves the CPU out)")


@dataclasses.dataclass(frozen=True)
class TierCounts:
    layer_tokens: int = 0        # (layer, decode token) pairs stepped
    core_hits: int = 0           # picks served by the static core
    tier_hits: int = 0           # picks served by the tier
    uploads: int = 0             # misses uploaded now and computed on the GPU
    cpu: int = 0                 # misses computed on the CPU (distinct experts per layer and token)
    bytes: int = 0               # bytes uploaded

    def __add__(self, o: "TierCounts") -> "TierCounts":
        return TierCounts(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(o))))


def read_counts(model_ptr: int, reset: bool = False) -> TierCounts:
    out = (ctypes.c_uint64 * 6)()
    _bind().llama_moeslots_tier_counts(model_ptr, out, 6, reset)
    return TierCounts(*[int(v) for v in out])


def residents(model_ptr: int, il: int, n_tier: int) -> tuple[int, ...]:
    buf = (ctypes.c_int32 * max(1, n_tier))()
    n = int(_bind().llama_moeslots_tier_residents(model_ptr, il, buf, n_tier))
    if n < 0:
        raise CacheError(f"layer {il} has no tier", ERR_INPUT)
    return tuple(int(e) for e in buf[:min(n, n_tier)])


class NativeTier:
    """The engine's tier over a plan of S slots per layer (its last `tier` slots move); the same face as
    the first (Python-stepped) tier had for engine.residency. Between decodes: `step()` takes the counts (the
    inspector's split) and, every REFRESH decode tokens with uploads, returns the plan the cache holds then."""

    REFRESH = 32     # decode tokens between two readings of the tier's residents (the inspector's heatmap)
    COUNT_EVERY = 16  # a GPU-stepped tier: decode tokens between two readings of its counts (one read per layer)

    def __init__(self, model_ptr: int, plan: SlotPlan, tier: int, cost: CostModel, *, device: bool = False,
                 share: bool = False, worker: int = 0) -> None:
        """worker: with a CPU share on the GPU, the threads of a worker that computes it outside the graph (0:
        the graph's own CPU split)."""
        self.model_ptr, self.tier, self.cost, self.device, self.share = model_ptr, tier, cost, device, share
        self._plan = plan
        self.layers = set_tier(model_ptr, tier, cost, device=device, share=share)
        if worker > 0:
            try:
                set_worker(model_ptr, worker)
            except CacheError:
                set_tier(model_ptr, 0, None, device=device)
                raise
        self.n_layers = max(1, self.layers)             # the layers with a tier (partly resident trunk layers)
        self.counts = TierCounts()
        self._dirty = 0                                  # decode tokens with uploads since the plan was read
        self._since = 0
        self._unread = 0                                 # decode tokens since the counts were read
        read_counts(model_ptr, reset=True)

    @property
    def tokens(self) -> int:
        return self.counts.layer_tokens // self.n_layers

    def step(self, n_new: int = 1, *, force: bool = False) -> SlotPlan | None:
        """After a decode step (between decodes): add the counts since the last step (a GPU-stepped tier: every
        COUNT_EVERY tokens, or now with force); returns the cache's plan when slots moved and REFRESH tokens have
        passed since it was last read, else None."""
        self._unread += n_new
        if self.device and not force and self._unread < self.COUNT_EVERY:
            return None
        n_new, self._unread = self._unread, 0
        c = read_counts(self.model_ptr, reset=True)
        self.counts = self.counts + c
        self._since += n_new
        self._dirty += c.uploads
        if self._dirty and self._since >= self.REFRESH:
            return self.refresh()
        return None

    def refresh(self) -> SlotPlan:
        """Read the tier's residents now: the plan the cache holds."""
        self._dirty = self._since = 0
        layers = {}
        for il, slots in self._plan.layers.items():
            try:
                now = residents(self.model_ptr, il, self.tier)
            except CacheError:                       # a layer without a tier (fully resident, or a NextN block)
                layers[il] = slots
                continue
            layers[il] = tuple(slots[:len(slots) - self.tier]) + now
        self._plan = SlotPlan(layers)
        return self._plan

    @property
    def plan(self) -> SlotPlan:
        return self._plan

    def split(self) -> tuple[float, float, float, float]:
        """Per decode token: core picks, tier picks, CPU misses, uploads now."""
        c, n = self.counts, max(1, self.tokens)
        return c.core_hits / n, c.tier_hits / n, c.cpu / n, c.uploads / n

    def close(self) -> None:
        try:
            set_tier(self.model_ptr, 0, None, device=self.device)
        except CacheError:
            pass


def masks(plan: SlotPlan, tier: int, n_expert: int) -> tuple[np.ndarray, np.ndarray]:
    """The plan's core and the tier's first residents as masks [layers in order, n_expert]: per layer its first
    S - tier slots, and its last `tier` (plans from profiles list the best-ranked experts first). The simulator's
    view of what set_tier starts from."""
    layers = sorted(plan.layers)
    core = np.zeros((len(layers), n_expert), bool)
    first = np.zeros_like(core)
    for j, il in enumerate(layers):
        slots = plan.slots_of(il)
        core[j, list(slots[:len(slots) - tier])] = True
        first[j, list(slots[len(slots) - tier:])] = True
    return core, first
