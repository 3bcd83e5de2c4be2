"""Routing locality of a trace, the numbers published measurements of real models use (docs/profiles.md):
reuse distance, the share of a token's picks already picked in the last W tokens, the working set of W tokens, and
per-layer skew. All on the token matrix P [T, L, k] of profiles.simulate.token_matrix; numpy only.

Reuse distance of a pick (token t, layer l, expert e): t minus the last token before t that picked e in layer l
(-1 when e was not picked before in the trace). The share of picks with reuse distance <= W is the hit rate of a
cache that holds exactly the last W tokens' experts (no capacity limit): "overlap over W tokens". Under routing
that picks k of n experts uniformly at random it is 1 - (1 - k/n)^W.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


def reuse_distances(P: np.ndarray, n_expert: int) -> np.ndarray:
    """[T, L, k] int64: tokens since the same (layer, expert) was last picked; -1 for a first pick."""
    T, L, k = P.shape
    last = np.full((L, n_expert), -1, np.int64)
    out = np.empty((T, L, k), np.int64)
    rows = np.arange(L)[:, None]
    for t in range(T):
        prev = last[rows, P[t]]
        out[t] = np.where(prev >= 0, t - prev, -1)
        last[rows, P[t]] = t
    return out


def window_overlap(dist: np.ndarray, windows: Sequence[int], start: int | None = None) -> dict[int, float]:
    """Share of picks whose expert was picked in the same layer within the previous W tokens, for each W; tokens
    before `start` (default: the largest W) are history only, so every W is measured on the same tokens."""
    s = max(windows) if start is None else start
    d = dist[s:]
    if d.size == 0:
        return {w: float("nan") for w in windows}
    return {w: float(((d >= 1) & (d <= w)).mean()) for w in windows}


def uniform_overlap(k: int, n_expert: int, w: int) -> float:
    """window_overlap under uniform random routing (k distinct of n per token, independent tokens)."""
    return 1.0 - (1.0 - k / n_expert) ** w


def working_set(P: np.ndarray, w: int, n_expert: int) -> float:
    """Mean number of distinct experts per layer in non-overlapping windows of w consecutive tokens."""
    T, L, k = P.shape
    n = T // w
    if n == 0:
        return float("nan")
    B = P[:n * w].reshape(n, w, L, k).transpose(0, 2, 1, 3).reshape(n, L, w * k)
    seen = np.zeros((n, L, n_expert), bool)
    np.put_along_axis(seen, B, True, axis=2)
    return float(seen.sum(axis=2).mean())


@dataclasses.dataclass(frozen=True)
class Locality:
    tokens: int
    overlap: dict[int, float]            # W -> share of picks reused within W tokens
    uniform: dict[int, float]            # the same under uniform random routing
    median_reuse: float                  # median reuse distance of picks that are reuses
    p90_reuse: float
    never_reused: float                  # share of picks that are a layer's first pick of that expert
    working_set: dict[int, float]        # W -> distinct experts per layer in W tokens


def locality(P: np.ndarray, n_expert: int, windows: Sequence[int] = (1, 8, 64)) -> Locality:
    T, L, k = P.shape
    dist = reuse_distances(P, n_expert)
    reused = dist[dist >= 1]
    return Locality(T, window_overlap(dist, windows), {w: uniform_overlap(k, n_expert, w) for w in windows},
                    float(np.median(reused)) if reused.size else float("nan"),
                    float(np.percentile(reused, 90)) if reused.size else float("nan"),
                    float((dist < 0).mean()), {w: working_set(P, w, n_expert) for w in windows})


def layer_skew(counts: np.ndarray, shares: Sequence[float] = (0.10, 0.25)) -> dict[str, np.ndarray]:
    """Per layer (rows of counts [L, n_expert] that routed): the share of its picks its top x % experts carry, for
    each x in shares ("top10", "top25"), and the effective number of experts exp(entropy) ("effective")."""
    c = counts[counts.sum(axis=1) > 0].astype(np.float64)
    if c.size == 0:
        return {}
    n = c.shape[1]
    p = c / c.sum(axis=1, keepdims=True)
    s = np.sort(p, axis=1)[:, ::-1]
    out = {f"top{round(x * 100)}": s[:, :max(1, round(x * n))].sum(axis=1) for x in shares}
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
    out["effective"] = np.exp(h)
    return out
