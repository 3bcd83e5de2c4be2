"""Slot plans from profiles: per layer the S experts with the most decode picks (ties -> lower id); layers
without data get an even spread. `auto_slots` picks the largest S whose packs fit the free VRAM minus a margin."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def plan_from_counts(counts: np.ndarray, slots: int, layers: list[int] | None = None) -> dict[int, tuple[int, ...]]:
    n_layer, n_expert = counts.shape
    slots = max(0, min(slots, n_expert))
    out: dict[int, tuple[int, ...]] = {}
    for il in (range(n_layer) if layers is None else layers):
        c = counts[il]
        if c.sum() == 0:
            step = n_expert / slots if slots else 1
            out[il] = tuple(sorted({int(j * step) % n_expert for j in range(slots)}))
        else:
            order = np.lexsort((np.arange(n_expert), -c.astype(np.int64)))  # count desc, then id asc
            out[il] = tuple(int(e) for e in order[:slots])
    return out


def pack_bytes(slots: int, n_layers: int, slab_bytes: int) -> int:
    """Bytes of the hot packs: S slots per layer (no zero slot: a negative id selects no expert)."""
    return n_layers * slots * slab_bytes if slots > 0 else 0


def auto_slots(free_bytes: int, n_layers: int, slab_bytes: int, n_expert: int,
               margin_bytes: int = 1 << 30, spare: bool = False) -> int:
    """The largest S with pack_bytes(S) <= free - margin (0 when not even one slot fits); `spare`: each layer's
    pack holds one more slab (overlapped re-pick or tier copies land there), counted too."""
    budget = free_bytes - margin_bytes
    if budget <= 0 or slab_bytes <= 0 or n_layers <= 0:
        return 0
    s = budget // (n_layers * slab_bytes) - int(spare)
    return int(max(0, min(n_expert, s)))


def elect(scores: np.ndarray, resident: Sequence[int], max_swaps: int, margin: float = 0.0) -> list[tuple[int, int]]:
    """One layer's re-pick (the rule shared by the engine's repick and the simulator's reelect-K): the best
    non-resident experts replace the weakest residents while the candidate's score beats the incumbent's by more
    than `margin` (relative; hysteresis), at most `max_swaps` times. Ties: lower ids win candidacy, higher-scored
    then lower-id incumbents stay. Returns (slot, new expert) pairs."""
    res = np.asarray(list(resident), np.int64)
    if not res.size or max_swaps <= 0:
        return []
    out = np.ones(scores.size, bool)
    out[res] = False
    if not out.any() or not scores[out].max() > scores[res].min() * (1.0 + margin):
        return []               # the best candidate cannot beat the weakest resident: the common case, cheaply
    by_score = np.lexsort((np.arange(scores.size), -scores))                 # best first, lower id on ties
    cands = by_score[out[by_score]][:max_swaps]
    weakest = np.lexsort((-res, scores[res]))[:max_swaps]                    # weakest slot first, higher id first
    swaps: list[tuple[int, int]] = []
    for cand, slot in zip(cands.tolist(), weakest.tolist()):
        if not scores[cand] > scores[res[slot]] * (1.0 + margin):
            break
        swaps.append((slot, cand))
    return swaps
