"""The hybrid residency policy, simulated: per layer a static core (from a profile) plus a dynamic tier of D slots,
and for every missed expert a decision by this machine's costs — compute it on the CPU now, upload it now and
compute it on the GPU, or compute it on the CPU now and upload it for later (prefetch into the tier while the rest
of the token computes).

Timing model per decode token: the GPU's work (base + resident picks), and per layer its misses split between the
CPU (slab / CPU GB/s each) and synchronous uploads (slab / PCIe GB/s each), which run concurrently, so a layer
costs max(CPU part, upload part); the split that minimises it uploads m * t_cpu / (t_cpu + t_up) of m misses.
Prefetches use the PCIe time left over in the token. The tier evicts by decayed pick frequency (recency and
frequency in one score); an expert is admitted only when it outscores the weakest tier entry.

D = 0 is the static cache (every miss on the CPU); core 0 with uploads always cheaper is a dynamic cache (llama.cpp's
`--moe-cache-mib` way). The engine does not run this policy yet; the simulator says what it would buy.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from .costs import CostModel


@dataclasses.dataclass(frozen=True)
class HybridResult:
    core: int                       # static slots per layer
    tier: int                       # dynamic slots per layer
    hit_rate: float                 # picks found in VRAM (core or tier) when picked
    tier_hit_rate: float            # of those, from the tier
    sync_uploads_per_token: float   # misses uploaded and computed on the GPU at once
    prefetch_per_token: float       # misses computed on the CPU and uploaded for later
    cpu_picks_per_token: float
    ms_per_token: float

    @property
    def policy(self) -> str:
        return "static" if self.tier == 0 else "dynamic" if self.core == 0 else "hybrid"


def best_split(misses: int, t_cpu: float, t_up: float, room: int) -> int:
    """How many of `misses` to upload now (at most `room`) so that max(uploads * t_up, CPU picks * t_cpu) is least."""
    if misses <= 0 or room <= 0:
        return 0
    u = misses * t_cpu / (t_cpu + t_up)
    cands = {0, min(room, misses), min(room, math.floor(u)), min(room, math.ceil(u))}
    return min(cands, key=lambda n: (max(n * t_up, (misses - n) * t_cpu), n))


def simulate_hybrid(P: np.ndarray, core: np.ndarray, tier: int, cost: CostModel, *, decay: float = 0.95,
                    prefetch: bool = True, overlap: bool = True) -> HybridResult:
    """P: decode picks [T, L, k]; core: static residents [L, n_expert] (bool); tier: dynamic slots per layer."""
    T, L, k = P.shape
    n_expert = core.shape[1]
    t_cpu, t_up = cost.slab_mb / cost.cpu_gbps, cost.slab_mb / cost.pcie_gbps
    t_gpu = cost.slab_mb / cost.gpu_gbps
    in_tier = np.zeros((L, n_expert), bool)
    n_tier = np.zeros(L, np.int64)
    score = np.zeros((L, n_expert))
    rows = np.arange(L)
    hits = tier_hits = sync = pref = cpu = 0
    total_ms = 0.0
    for t in range(T):
        ids = P[t]                                                  # [L, k]
        score *= decay
        np.add.at(score, (np.repeat(rows, k), ids.ravel()), 1.0)
        res = core | in_tier
        hit = res[rows[:, None], ids]
        hits += int(hit.sum())
        tier_hits += int((in_tier[rows[:, None], ids] & ~core[rows[:, None], ids]).sum())
        token_ms = cost.base_ms + int(hit.sum()) * t_gpu
        up_ms = 0.0
        cpu_left: list[tuple[float, int, int]] = []                # (score, layer, expert) computed on the CPU
        for l in range(L):
            miss = np.unique(ids[l][~hit[l]])
            if miss.size == 0:
                continue
            if overlap:
                u = best_split(miss.size, t_cpu, t_up, tier)
            else:
                u = min(tier, miss.size) if t_up < t_cpu else 0
            order = miss[np.argsort(-score[l, miss], kind="stable")]
            for e in order[:u]:
                _admit(in_tier, n_tier, score, l, int(e), tier, ids[l], force=True)
            c = miss.size - u
            sync, cpu = sync + u, cpu + c
            layer_ms = max(u * t_up, c * t_cpu) if overlap else u * t_up + c * t_cpu
            token_ms += layer_ms + u * t_gpu
            up_ms += u * t_up
            cpu_left += [(float(score[l, e]), l, int(e)) for e in order[u:]]
        if prefetch and tier > 0 and cpu_left:
            budget = int(max(0.0, token_ms - up_ms) // t_up)
            for s, l, e in sorted(cpu_left, reverse=True)[:budget]:
                if _admit(in_tier, n_tier, score, l, e, tier, ids[l], force=False):
                    pref += 1
        total_ms += token_ms
    picks = T * L * k
    return HybridResult(int(core.sum(axis=1).max()) if core.size else 0, tier, hits / picks,
                        tier_hits / max(1, hits), sync / T, pref / T, cpu / T, total_ms / T)


def _admit(in_tier: np.ndarray, n_tier: np.ndarray, score: np.ndarray, l: int, e: int, cap: int,
           now: np.ndarray, *, force: bool) -> bool:
    """Put expert e of layer l in the tier, evicting the lowest-scored entry not picked by this token. force: admit
    even when e scores lower (it is needed now); otherwise only when it outscores the victim."""
    if in_tier[l, e] or cap <= 0:
        return False
    if n_tier[l] < cap:
        in_tier[l, e] = True
        n_tier[l] += 1
        return True
    cand = np.flatnonzero(in_tier[l])
    cand = cand[~np.isin(cand, now)]
    if cand.size == 0:
        return False
    victim = int(cand[np.argmin(score[l, cand])])
    if not force and score[l, e] <= score[l, victim]:
        return False
    in_tier[l, victim] = False
    in_tier[l, e] = True
    return True


def sweep(P: np.ndarray, plan_counts: np.ndarray, slots: int, cost: CostModel,
          tiers: Sequence[int] | None = None, **kw: object) -> list[HybridResult]:
    """Static core of slots - D experts (the profile's top picks per layer, plan_counts [L, n_expert]) plus D tier
    slots, for each D in `tiers` (default 0, S/8, S/4, S/2, S)."""
    L, n_expert = plan_counts.shape
    tiers = sorted({0, slots // 8, slots // 4, slots // 2, slots} if tiers is None else set(tiers))
    out = []
    order = np.argsort(-plan_counts, axis=1, kind="stable")
    for d in tiers:
        if not 0 <= d <= slots:
            raise ValueError(f"tier {d} outside 0..{slots}")
        core = np.zeros((L, n_expert), bool)
        np.put_along_axis(core, order[:, :slots - d], True, axis=1)
        out.append(simulate_hybrid(P, core, d, cost, **kw))   # type: ignore[arg-type]
    return out
