"""Profiles: decode-row pick counts per (layer, expert) and what they say (skew, coverage, overlap)."""

from __future__ import annotations

import dataclasses

import numpy as np

from .trace import Trace


@dataclasses.dataclass(frozen=True)
class Profile:
    counts: np.ndarray            # int64 [n_layer, n_expert], decode rows only
    prompt_counts: np.ndarray     # int64 [n_layer, n_expert], prompt rows
    decode_tokens: int
    prompt_rows: int

    @property
    def n_layer(self) -> int:
        return int(self.counts.shape[0])

    @property
    def n_expert(self) -> int:
        return int(self.counts.shape[1])

    def layers_with_data(self) -> list[int]:
        return [il for il in range(self.n_layer) if self.counts[il].sum() > 0]


def from_trace(t: Trace, n_layer: int | None = None, n_expert: int | None = None) -> Profile:
    n_layer = n_layer or t.n_layer
    n_expert = n_expert or t.n_expert
    counts = np.zeros((n_layer, n_expert), np.int64)
    prompt = np.zeros((n_layer, n_expert), np.int64)
    if t.n_rows:
        d = t.decode
        rows_l = np.repeat(t.layer[:, None], t.k, axis=1)
        np.add.at(counts, (rows_l[d].ravel(), t.ids[d].ravel()), 1)
        np.add.at(prompt, (rows_l[~d].ravel(), t.ids[~d].ravel()), 1)
    return Profile(counts, prompt, t.decode_tokens, int((~t.decode).sum()) if t.n_rows else 0)


def skew(p: Profile, shares: tuple[float, ...] = (0.10, 0.25, 0.50)) -> dict[float, float]:
    """Share of all decode picks carried by the top x % of (layer, expert) pairs, over the layers that routed
    (dense layers and an unused NextN block would otherwise add empty pairs and inflate the share)."""
    routed = p.counts[p.counts.sum(axis=1) > 0]
    flat = np.sort(routed.ravel())[::-1]
    total = max(1, int(flat.sum()))
    return {s: float(flat[:max(1, round(s * flat.size))].sum() / total) for s in shares}


def coverage(p: Profile, slots: int) -> np.ndarray:
    """Per layer: share of its decode picks that the top-`slots` experts of that layer carry (the static hit rate
    the profile predicts for itself)."""
    s = np.sort(p.counts, axis=1)[:, ::-1]
    tot = s.sum(axis=1).astype(np.float64)
    return np.divide(s[:, :slots].sum(axis=1), tot, out=np.zeros_like(tot), where=tot > 0)


def top_sets(p: Profile, slots: int) -> list[set[int]]:
    from .plan import plan_from_counts

    plan = plan_from_counts(p.counts, slots)
    return [set(plan[il]) for il in range(p.n_layer)]


def overlap(a: Profile, b: Profile, slots: int) -> np.ndarray:
    """Per layer: |top_a ∩ top_b| / slots (1 = the two workloads want the same experts)."""
    ta, tb = top_sets(a, slots), top_sets(b, slots)
    return np.array([len(x & y) / slots if slots else 1.0 for x, y in zip(ta, tb)])


HEAT = " ▁▂▃▄▅▆▇█"


def heatmap_rows(p: Profile, width: int = 64) -> list[str]:
    """One text row per layer: experts sorted by count, bucketed into `width` cells, shaded by share."""
    rows = []
    for il in range(p.n_layer):
        c = np.sort(p.counts[il])[::-1].astype(np.float64)
        if c.sum() == 0:
            rows.append(f"L{il:02d} (no data)")
            continue
        cells = np.array_split(c, min(width, c.size))
        v = np.array([x.mean() for x in cells])
        lvl = np.clip((v / v.max() * (len(HEAT) - 1)).round().astype(int), 0, len(HEAT) - 1)
        rows.append(f"L{il:02d} " + "".join(HEAT[i] for i in lvl))
    return rows
