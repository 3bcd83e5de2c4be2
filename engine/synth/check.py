"""The routing check every synthetic model gets: random tokens through the engine, the router traced, and how far
the picks are from uniform (distinct experts per layer, share of the top 10 %). A degenerate model (a few experts
take most picks) makes any cache look perfect."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np


@dataclasses.dataclass(frozen=True)
class RoutingCheck:
    n_tokens: int
    n_expert: int
    k: int
    distinct: dict[int, int]       # layer -> distinct experts used over the tokens
    top10_share: dict[int, float]  # layer -> share of picks carried by the top 10 % experts

    @property
    def expected_distinct(self) -> float:
        """Uniform routing: each expert is missed by a token with probability 1 - k/n."""
        return self.n_expert * (1 - (1 - self.k / self.n_expert) ** self.n_tokens)

    @property
    def mean_distinct(self) -> float:
        return float(np.mean(list(self.distinct.values())))

    @property
    def mean_top10(self) -> float:
        return float(np.mean(list(self.top10_share.values())))

    @property
    def degenerate(self) -> bool:
        return self.mean_distinct < 0.5 * self.expected_distinct or self.mean_top10 > 0.5

    def render(self) -> str:
        uni_top10 = max(1, round(0.1 * self.n_expert)) / self.n_expert
        lines = [f"routing check over {self.n_tokens} random tokens ({self.n_expert} experts, {self.k} used):",
                 f"  distinct experts per layer: mean {self.mean_distinct:.1f} (uniform routing: "
                 f"{self.expected_distinct:.1f}); min {min(self.distinct.values())}, max {max(self.distinct.values())}",
                 f"  share of picks in the top 10 % of experts: mean {100 * self.mean_top10:.1f} % "
                 f"(uniform: ~{100 * uni_top10:.0f} %, degenerate: > 50 %)",
                 f"  regime: {'DEGENERATE' if self.degenerate else 'non-degenerate'}"]
        return "\n".join(lines)


def summarize_routing(picks: dict[int, np.ndarray], n_expert: int, k: int) -> RoutingCheck:
    """picks: layer -> int array [n_tokens, k]."""
    from ..native.routing_stats import regime

    distinct, top10 = {}, {}
    n_tokens = 0
    for il, ids in sorted(picks.items()):
        distinct[il], top10[il] = regime(np.bincount(ids.ravel(), minlength=n_expert))
        n_tokens = max(n_tokens, ids.shape[0])
    return RoutingCheck(n_tokens, n_expert, k, distinct, top10)


def routing_check(path: Path, n_tokens: int = 256, threads: int | None = None, seed: int = 1) -> RoutingCheck:
    """Run n_tokens random tokens through the engine (one batch, all rows output) and trace the router."""
    from ..native import evaltrace as trace

    tr = trace.trace_random_tokens(Path(path), n_tokens=n_tokens, threads=threads, seed=seed)
    return summarize_routing(tr.picks, tr.n_expert, tr.k)
