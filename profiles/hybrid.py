"""The hybrid residency policy: per layer a static core (from a profile) plus a dynamic tier of D slots, and for every
missed expert a decision by this machine's costs — compute it on the CPU now, upload it now and compute it on the
GPU, or compute it on the CPU now and upload it for later (prefetch into the tier while the rest of the token
computes). `Tier` is the rule, one decode token at a time; the simulator (simulate_hybrid, sweep) runs it, and the
engine (patch 0007, engine.native_tier, `--policy hybrid|dynamic`) runs the same rule in C++ inside its graph, so
the simulator predicts what the engine does (its hits, uploads and CPU misses exactly: tests/engine).

Timing model per decode token: the GPU's work (base + resident picks), and per layer its misses split between the
CPU (slab / CPU GB/s each) and synchronous uploads (slab / PCIe GB/s each), which run concurrently, so a layer
costs max(CPU part, upload part); the split that minimises it uploads m * t_cpu / (t_cpu + t_up) of m misses. From
pageable memory (cost.serial_uploads) the two parts add, and the least sum uploads every miss it can or none
(rule_costs: the engine gets the same weights). With a tier every layer adds its route node (cost.route_ms).
Prefetches use the PCIe time left over in the token, best-scored misses first. The tier evicts by decayed pick
frequency (recency and frequency in one score); a prefetch is admitted only when it outscores the weakest tier entry
not picked by this token.

How admissions reach VRAM is a `Mechanism`. IDEAL (the simulator's default): uploads now, prefetches resident from
the next token, any number per layer; an upload with no tier entry to replace is a transient copy. NATIVE = ENGINE
(what the engine does, patch 0007): uploads now into the tier, no prefetch, no transient copy (a miss with no entry
to replace stays on the CPU; NATIVE_GPU_PACK: with the pack on a GPU, multi-token batches read the tier as it
stands). FETCH (`--policy fetch`, patch 0008): the tier stepped on the GPU, every miss of a batch whose picks fit in
the tier uploaded now, none computed on the CPU, no host round trip. FETCH_SPLIT (`--policy fetch-split`): the same,
but of each layer's misses only the best-scored share_copies are copied, the CPU computing the others beside the
copies (a layer costs profiles.split.fetch_layers_ms: the larger of its copies with the GPU's own work beside
the share and its CPU part, plus share_ms). STAGED (a what-if: the engine's first tier,
stepped from Python): no upload now, a prefetch staged into a spare pack entry while the next token decodes and
committed after it (resident one token later than IDEAL: lag 1), one copy in flight per layer.

D = 0 is the static cache (every miss on the CPU); core 0 is a dynamic cache (with cheap uploads now, llama.cpp's
`--moe-cache-mib` way).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from .costs import CostModel
from .split import (
    best_split,
    expert_ms,
    fetch_layers_ms,
    rule_costs,
    share_copies,
    share_costs,
    share_ratio,
)


@dataclasses.dataclass(frozen=True)
class Mechanism:
    upload_now: bool = True         # a miss may be uploaded and computed on the GPU in the same token
    lag: int = 0                    # tokens between a prefetch decision's next token and its slab being resident
    one_per_layer: bool = False     # at most one prefetch in flight per layer
    transient: bool = True          # an upload now with no tier entry to replace is still made (then dropped)
    prefetch: bool = True           # misses computed on the CPU may be uploaded for later
    batch_steps: bool = True        # multi-token decode batches step the tier (else they read it as it stands)
    device: bool = False            # the tier stepped on the GPU (patch 0008): every miss uploaded, none on the CPU, no
                                    # host round trip; a batch whose picks do not fit in the tier reads it as it stands
    cpu_share: bool = False         # with `device`: only share_copies of each layer's misses uploaded, the CPU
                                    # computing the others beside the copies (`--policy fetch-split`), each layer
                                    # adding share_ms

    def __post_init__(self) -> None:
        if self.lag > 0 and not self.one_per_layer:
            raise ValueError("a prefetch lag needs one copy in flight per layer")


IDEAL = Mechanism()
NATIVE = Mechanism(transient=False, prefetch=False)
ENGINE = NATIVE                     # what the engine runs
FETCH = Mechanism(transient=False, prefetch=False, device=True)   # `--policy fetch`: the GPU-stepped tier


FETCH_SPLIT = Mechanism(transient=False, prefetch=False, device=True, cpu_share=True)   # `--policy fetch-split`
NATIVE_GPU_PACK = Mechanism(transient=False, prefetch=False, batch_steps=False)  # the engine's, pack on a GPU
STAGED = Mechanism(upload_now=False, lag=1, one_per_layer=True)


@dataclasses.dataclass(frozen=True)
class HybridResult:
    core: int                       # static slots per layer
    tier: int                       # dynamic slots per layer
    hit_rate: float                 # picks found in VRAM (core or tier) when picked
    tier_hit_rate: float            # of those, from the tier
    sync_uploads_per_token: float   # misses uploaded and computed on the GPU at once
    prefetch_per_token: float       # misses computed on the CPU and uploaded for later (landed)
    cpu_picks_per_token: float
    ms_per_token: float

    @property
    def policy(self) -> str:
        return "static" if self.tier == 0 else "dynamic" if self.core == 0 else "hybrid"


@dataclasses.dataclass(frozen=True)
class Step:
    """One decode token under the rule: picks served by the core and the tier, computed on the CPU, uploads now
    [(layer, expert)], prefetches decided [(layer, expert, victim expert or -1 for a free entry)], est. ms."""
    core_hits: int
    tier_hits: int
    cpu: int
    uploads_now: list[tuple[int, int]]
    prefetches: list[tuple[int, int, int]]
    ms: float


class Tier:
    """The rule's state over L layers: core [L, n_expert] (bool, fixed), the tier's residents (initial: bool
    [L, n_expert], disjoint from core, at most `tier` per layer; None: empty), decayed scores, copies in flight."""

    def __init__(self, core: np.ndarray, tier: int, cost: CostModel, *, initial: np.ndarray | None = None,
                 decay: float = 0.95, prefetch: bool = True, overlap: bool = True, mech: Mechanism = IDEAL) -> None:
        self.L, self.n_expert = core.shape
        self.core, self.cap, self.cost, self.decay = core.astype(bool), tier, cost, decay
        self.prefetch, self.mech = prefetch, mech
        self.overlap = overlap and not cost.serial_uploads       # uploads beside the CPU's work, else after it
        self.in_tier = np.zeros_like(self.core) if initial is None else initial.astype(bool) & ~self.core
        self.n_tier = self.in_tier.sum(axis=1).astype(np.int64)
        if (self.n_tier > tier).any():
            raise ValueError(f"an initial tier holds {int(self.n_tier.max())} experts, the tier {tier}")
        self.score = np.zeros(core.shape)
        self.pending: dict[int, tuple[int, int]] = {}      # layer -> (expert, victim or -1): a copy in flight
        self.t_cpu, self.t_up = expert_ms(cost)
        self.w_cpu, self.w_up = rule_costs(cost, not self.overlap)
        self.t_gpu = cost.slab_mb / cost.gpu_gbps
        self.t_share, self.t_fetch = share_costs(cost)
        self.ratio = share_ratio(cost)
        self._rows = np.arange(self.L)

    def land(self, layer: int) -> tuple[int, int]:
        """The layer's copy in flight is resident now; returns (expert, victim or -1)."""
        e, victim = self.pending.pop(layer)
        self._place(layer, e, victim)
        return e, victim

    def drop(self, layer: int) -> None:
        """The layer's copy in flight failed: the tier stays as it was."""
        self.pending.pop(layer, None)

    def _place(self, layer: int, e: int, victim: int) -> None:
        if victim >= 0:
            self.in_tier[layer, victim] = False
        else:
            self.n_tier[layer] += 1
        self.in_tier[layer, e] = True

    def _victim(self, layer: int, now: np.ndarray) -> int | None:
        """The tier entry to evict for a newcomer: -1 while the tier has room, else the lowest-scored entry not
        picked by this token and not leaving already (lower id on ties); None when every entry is needed."""
        if self.n_tier[layer] < self.cap:
            return -1
        cand = np.flatnonzero(self.in_tier[layer])
        busy = [self.pending[layer][1]] if layer in self.pending else []
        cand = cand[~np.isin(cand, now) & ~np.isin(cand, busy)]
        return int(cand[np.argmin(self.score[layer, cand])]) if cand.size else None

    def step(self, ids: np.ndarray) -> Step:
        """One decode token's picks ids [L, k]: score them, count where they were served (the residents of this
        moment), decide uploads now and prefetches (prefetches with lag 0 are resident from the next token; with a
        lag they wait in `pending` until land()). Vectorised over layers except uploads now (the simulator's)."""
        mech, cap = self.mech, self.cap
        if mech.device and ids.shape[1] > cap:
            return self._read_only(ids, 1)
        self._score(ids)
        n_core, n_tier, ml, me, up, now_up, c = self._serve(ids)
        ms = self.step_ms(1, n_core + n_tier, up, c)
        up_ms = float(up.sum() * self.t_up)
        pref: list[tuple[int, int, int]] = []
        if self.prefetch and mech.prefetch and cap > 0 and ml.size:
            budget = int(max(0.0, ms - up_ms) // self.t_up)
            if mech.one_per_layer and self.pending:
                ok = ~np.isin(ml, list(self.pending))
                ml, me = ml[ok], me[ok]
            sc = self.score[ml, me]
            order = np.lexsort((-me, -ml, -sc))                     # score, then layer, then expert: highest first
            ml, me, sc = ml[order], me[order], sc[order]
            pref = (self._prefetch_one_per_layer(ml, me, sc, ids, budget) if mech.one_per_layer
                    else self._prefetch_any(ml, me, sc, ids, budget))
        return Step(n_core, n_tier, int(c.sum()), now_up, pref, ms)

    def step_batch(self, ids: np.ndarray) -> Step:
        """A decode batch's picks ids [n, L, k] as the engine steps an MTP verify batch (the engine's mechanism only:
        uploads now, no prefetch): the scores decay and add row by row; every row is served by the residents of the
        batch's start; the misses are the batch's distinct non-resident experts per layer, best_split of them
        uploaded now (best-scored first) into entries no row of the batch picks, the others computed on the CPU."""
        mech = self.mech
        if (self.prefetch and mech.prefetch) or not mech.upload_now or mech.transient or mech.lag:
            raise ValueError("batched steps model the engine's mechanism only (uploads now, no prefetch)")
        n = ids.shape[0]
        if n == 1:
            return self.step(ids[0])
        if (mech.device and n * ids.shape[2] > self.cap) or not mech.batch_steps:
            return self._read_only(np.concatenate(list(ids), axis=1), n)
        for row in ids:
            self._score(row)
        n_core, n_tier, _, _, up, now_up, c = self._serve(np.concatenate(list(ids), axis=1))   # [L, n * k]
        return Step(n_core, n_tier, int(c.sum()), now_up, [], self.step_ms(n, n_core + n_tier, up, c))

    def _read_only(self, ids: np.ndarray, n: int) -> Step:
        """A GPU-stepped tier's batch whose picks do not fit in it (ids [L, n * k]): no scores, no uploads, the misses
        computed on the CPU (the layer's host chain, with its round trip)."""
        n_core, n_tier, _, _, up, _, c = self._serve(ids, place=False)
        return Step(n_core, n_tier, int(c.sum()), [], [], self.step_ms(n, n_core + n_tier, up, c, split=True))

    def _score(self, ids: np.ndarray) -> None:
        """One token's picks ids [L, k] into the scores (all decay first)."""
        L, E = self.L, self.n_expert
        self.score *= self.decay
        self.score.reshape(-1)[:] += np.bincount((self._rows[:, None] * E + ids).ravel(), minlength=L * E)

    def _serve(self, ids: np.ndarray, place: bool = True) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray,
                                                                  list[tuple[int, int]], np.ndarray]:
        """Picks ids [L, m] (one token's, or a batch's side by side) against the residents of this moment: picks
        served by the core and by the tier, then the distinct misses (by layer, then expert) less those uploaded now
        (ml, me), the uploads now per layer and as (layer, expert), the CPU misses per layer."""
        E, rows = self.n_expert, self._rows
        core_hit = self.core[rows[:, None], ids]
        tier_hit = self.in_tier[rows[:, None], ids] & ~core_hit
        key = np.unique((rows[:, None] * E + ids).ravel()[~(core_hit | tier_hit).ravel()])
        ml, me = key // E, key % E
        up = np.zeros(self.L, np.int64)
        now_up: list[tuple[int, int]] = []
        if place and self.mech.upload_now and self.cap > 0 and key.size:
            ml, me = self._upload_now(ml, me, ids, up, now_up)
        return int(core_hit.sum()), int(tier_hit.sum()), ml, me, up, now_up, np.bincount(ml, minlength=self.L)

    def step_ms(self, n_tokens: int, gpu_picks: int, up: np.ndarray, c: np.ndarray, split: bool = False) -> float:
        """Est. time of a step of n_tokens: the base per token, resident picks on the GPU, and per layer its uploads
        and CPU misses, concurrent (overlap) or one after the other. A GPU-stepped tier's step (not split): no host
        round trip per layer (base less the split's cost), its fetch per layer, and the uploads at the GPU's fetch
        rate."""
        cost = self.cost
        if self.mech.device and not split:
            return (cost.fetch_step_ms(self.L, n_tokens) + gpu_picks * self.t_gpu
                    + fetch_layers_ms(cost, up, c, self.mech.cpu_share) + float(up.sum()) * self.t_gpu)
        per_layer = np.maximum(up * self.t_up, c * self.t_cpu) if self.overlap else up * self.t_up + c * self.t_cpu
        route = self.L * cost.route_ms if self.cap > 0 and not self.mech.device else 0.0     # the host tier's node
        return (n_tokens * cost.base_ms + gpu_picks * self.t_gpu + float(np.sum(per_layer) + up.sum() * self.t_gpu)
                + route)

    def _upload_now(self, ml: np.ndarray, me: np.ndarray, ids: np.ndarray, up: np.ndarray,
                    now_up: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, the best_split share of its misses (best-scored first) uploaded and computed on the GPU now;
        returns the misses left to the CPU."""
        keep = np.ones(ml.size, bool)
        for layer in np.unique(ml).tolist():
            idx = np.flatnonzero(ml == layer)
            if self.mech.device and self.mech.cpu_share:
                u = share_copies(idx.size, self.ratio, self.cap)
            elif self.mech.device:
                u = min(self.cap, idx.size)                         # every miss, while entries last
            else:
                u = best_split(idx.size, self.w_cpu, self.w_up, self.cap)
            placed = 0
            for i in idx[np.argsort(-self.score[layer, me[idx]], kind="stable")][:u].tolist():
                e = int(me[i])                                      # (no free entry: a transient copy)
                v = self._victim(layer, ids[layer])
                if v is None and not self.mech.transient:
                    break                                           # NATIVE: the rest stay on the CPU
                if v is not None and not (layer in self.pending and self.pending[layer][0] == e):
                    self._place(layer, e, v)
                now_up.append((layer, e))
                keep[i] = False
                placed += 1
            up[layer] = placed
        return ml[keep], me[keep]

    def _admit(self, layer: int, e: int, v: int) -> tuple[int, int, int]:
        if self.mech.lag > 0:
            self.pending[layer] = (e, v)
        else:
            self._place(layer, e, v)
        return layer, e, v

    def _prefetch_any(self, ml: np.ndarray, me: np.ndarray, sc: np.ndarray, ids: np.ndarray,
                      budget: int) -> list[tuple[int, int, int]]:
        """Candidates in order, any number per layer: each admitted while the budget (copies) lasts and it outscores
        its victim (victims chosen afresh after each admission)."""
        out: list[tuple[int, int, int]] = []
        for layer, e, s in zip(ml.tolist(), me.tolist(), sc.tolist()):
            if len(out) >= budget:
                break
            v = self._victim(layer, ids[layer])
            if v is not None and (v < 0 or s > self.score[layer, v]):
                out.append(self._admit(layer, e, v))
        return out

    def _prefetch_one_per_layer(self, ml: np.ndarray, me: np.ndarray, sc: np.ndarray, ids: np.ndarray,
                                budget: int) -> list[tuple[int, int, int]]:
        """One copy per layer: each layer's best candidate against the layer's victim (the lower-scored ones cannot
        beat the same victim), layers in candidate order, at most `budget` copies."""
        _, first = np.unique(ml, return_index=True)
        first = np.sort(first)
        cl, ce, cs = ml[first], me[first], sc[first]
        mask = self.in_tier[cl].copy()
        mask[np.arange(cl.size)[:, None], ids[cl]] = False          # picked by this token: kept
        vs = np.where(mask, self.score[cl], np.inf)
        v = vs.argmin(axis=1)                                       # lowest score, lower id on ties
        free = self.n_tier[cl] < self.cap
        ok = free | (mask.any(axis=1) & (cs > vs[np.arange(cl.size), v]))
        v = np.where(free, -1, v)
        return [self._admit(layer, e, w) for layer, e, w in zip(cl[ok][:budget].tolist(), ce[ok][:budget].tolist(),
                                                               v[ok][:budget].tolist())]


def simulate_hybrid(P: np.ndarray, core: np.ndarray, tier: int, cost: CostModel, *, decay: float = 0.95,
                    prefetch: bool = True, overlap: bool = True, initial: np.ndarray | None = None,
                    mech: Mechanism = IDEAL, warmup: int = 0, batches: Sequence[int] | None = None) -> HybridResult:
    """P: decode picks [T, L, k]; core: static residents [L, n_expert] (bool); tier: dynamic slots per layer;
    initial: the tier's first residents (None: empty). With a lag, a prefetch decided at token t lands before
    token t + 1 + lag, as the engine's commits do when each copy is in by then. The first `warmup` tokens go
    through the rule uncounted (a benchmark's warm-up decodes). batches: the decode steps' sizes after the warm-up
    (sum T; None: one token each), a batch of several stepped as the engine steps an MTP verify batch
    (Tier.step_batch: the engine's mechanism only)."""
    rule = Tier(core, tier, cost, initial=initial, decay=decay, prefetch=prefetch, overlap=overlap, mech=mech)
    if warmup:
        if mech.lag > 0:
            raise ValueError("warm-up tokens with a prefetch lag are not modelled")
        for t in range(warmup):
            rule.step(P[t])
        P = P[warmup:]
    T, L, k = P.shape
    sizes = [1] * T if batches is None else [int(b) for b in batches]
    if sum(sizes) != T or min(sizes, default=1) < 1:
        raise ValueError(f"batches {sizes[:8]}... must be sizes >= 1 summing to the {T} tokens")
    if mech.lag > 0 and max(sizes, default=1) > 1:
        raise ValueError("batched steps with a prefetch lag are not modelled")
    due: dict[int, int] = {}                                        # layer -> token its copy lands before
    hits = tier_hits = sync = pref = cpu = 0
    total_ms = 0.0
    starts = np.cumsum([0] + sizes[:-1]).tolist()
    for t, n in zip(starts, sizes):
        for layer in [layer for layer, when in due.items() if when <= t]:
            rule.land(layer)
            del due[layer]
            pref += 1
        s = rule.step(P[t]) if n == 1 else rule.step_batch(P[t:t + n])
        hits, tier_hits = hits + s.core_hits + s.tier_hits, tier_hits + s.tier_hits
        sync, cpu, total_ms = sync + len(s.uploads_now), cpu + s.cpu, total_ms + s.ms
        if mech.lag > 0:
            due.update({layer: t + 1 + mech.lag for layer, _, _ in s.prefetches})
        else:
            pref += len(s.prefetches)
    pref += sum(when <= T for when in due.values())                 # committed after the last token (the engine's
    picks = T * L * k                                               # step after its last decode)
    return HybridResult(int(core.sum(axis=1).max()) if core.size else 0, tier, hits / picks,
                        tier_hits / max(1, hits), sync / T, pref / T, cpu / T, total_ms / T)


def core_and_tier(plan_counts: np.ndarray, slots: int, tier: int) -> tuple[np.ndarray, np.ndarray]:
    """The static plan of `slots` per layer split in two (plan_counts [L, n_expert]; best first, lower id on ties,
    as profiles.plan): its first slots - tier experts are the core, the rest the tier's first residents."""
    L, n_expert = plan_counts.shape
    if not 0 <= tier <= slots <= n_expert:
        raise ValueError(f"tier {tier} outside 0..{slots}" if slots <= n_expert
                         else f"{slots} slots per layer: the profile has {n_expert} experts")
    order = np.lexsort((np.broadcast_to(np.arange(n_expert), (L, n_expert)), -plan_counts.astype(np.int64)), axis=-1)
    core, first = np.zeros((L, n_expert), bool), np.zeros((L, n_expert), bool)
    np.put_along_axis(core, order[:, :slots - tier], True, axis=1)
    np.put_along_axis(first, order[:, slots - tier:slots], True, axis=1)
    return core, first


def sweep(P: np.ndarray, plan_counts: np.ndarray, slots: int, cost: CostModel,
          tiers: Sequence[int] | None = None, **kw: object) -> list[HybridResult]:
    """Static core of slots - D experts (the profile's top picks per layer, plan_counts [L, n_expert]) plus D tier
    slots that start with the profile's next D experts, for each D in `tiers` (default 0, S/8, S/4, S/2, S)."""
    tiers = sorted({0, slots // 8, slots // 4, slots // 2, slots} if tiers is None else set(tiers))
    out = []
    for d in tiers:
        core, first = core_and_tier(plan_counts, slots, d)
        out.append(simulate_hybrid(P, core, d, cost, initial=first, **kw))   # type: ignore[arg-type]
    return out
