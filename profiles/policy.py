"""The residency policy (`--policy static|hybrid|dynamic|auto`): how many of a layer's S slots are a dynamic tier
(profiles.hybrid), and `auto`'s choice among them, simulated with the engine's mechanism under a cost model."""

from __future__ import annotations

from typing import Sequence

from .costs import CostModel
from .hybrid import ENGINE, Mechanism, core_and_tier, simulate_hybrid
from .repick import Picks, _picks
from .simulate import layer_counts
from .trace import Trace

POLICIES = ("static", "hybrid", "dynamic", "auto")
MAX_SCORED = 512          # tokens `auto` scores (the last ones of the profile): a load-time decision, kept short


def tier_slots(policy: str, slots: int, tier: int | None = None) -> int:
    """Dynamic slots per layer of `slots` under a policy: static 0, dynamic all, hybrid `tier` (default S/4, at
    least 1 when there are slots)."""
    if policy not in POLICIES or policy == "auto":
        raise ValueError(f"policy {policy!r}: one of static, hybrid, dynamic" + (" (auto is decided first)"
                                                                                 if policy == "auto" else ""))
    if policy == "static" or slots <= 0:
        return 0
    if policy == "dynamic":
        return slots
    d = max(1, slots // 4) if tier is None else tier
    if not 0 <= d <= slots:
        raise ValueError(f"a tier of {d} slots: the layer has {slots}")
    return d


def name(slots: int, tier: int) -> str:
    return "static" if tier == 0 or slots == 0 else "dynamic" if tier == slots else "hybrid"


def choose_policy(trace: "Trace | Picks", slots: int, cost: CostModel | None = None, *,
                  tiers: Sequence[int] | None = None, mech: Mechanism = ENGINE, holdout: float = 0.5,
                  min_gain: float = 0.05, max_scored: int = MAX_SCORED) -> tuple[str, int, str]:
    """`--policy auto`: the tier size (0 = static) with the lowest estimated ms/token, the rule run with the engine's
    mechanism (each token's misses split between the CPU and uploads now by cost; no prefetch). As choose_repick: the core
    comes from the first part of the profile and every choice is scored on its last part (at most `max_scored`
    tokens), a tier only when it is estimated `min_gain` faster than static. Deterministic. Returns (policy, tier
    slots, one line saying why)."""
    cost = cost or CostModel()
    pk = _picks(trace)
    P, layers, n_expert = pk.P, pk.layers, pk.n_expert
    if slots <= 0:
        return "static", 0, "static: no slots, no tier"
    T = P.shape[0]
    cut = int(round(T * (1 - holdout)))
    split = 0 < holdout < 1 and min(cut, T - cut) >= 128
    train, test = (P[:cut], P[cut:]) if split else (P, P)
    test = test[-max_scored:]
    counts = layer_counts(train, layers, n_expert)[layers]
    ds = sorted({0, max(1, slots // 4), slots // 2, slots} if tiers is None else {0, *tiers})
    results = []
    for d in ds:
        core, first = core_and_tier(counts, slots, d)
        results.append((simulate_hybrid(test, core, d, cost, initial=first, mech=mech), d))
    static = results[0][0]
    best, d = min(results[1:], key=lambda r: (r[0].ms_per_token, r[1]), default=results[0])
    gain = 1 - best.ms_per_token / static.ms_per_token if static.ms_per_token > 0 else 0.0
    scored = (f"core from the profile's first {cut} tokens, scored on {len(test)} later ones" if split
              else f"profile of {T} tokens scored in-sample")
    if d == 0 or gain < max(min_gain, 1e-9):
        return "static", 0, (f"static: {100 * static.hit_rate:.0f} % hits at {slots} slots, est. "
                             f"{static.ms_per_token:.2f} ms/token; the best tier ({d} slots) "
                             f"{'saves' if gain > 0 else 'would save'} {100 * max(gain, 0):.1f} %, under "
                             f"{100 * min_gain:.0f} % ({scored}; uploads {cost.pcie_gbps:.1f} GB/s, CPU "
                             f"{cost.cpu_gbps:.1f} GB/s)")
    pol = name(slots, d)
    return pol, d, (f"{pol}: {slots - d} core + {d} tier slots, {100 * best.hit_rate:.0f} % hits (static "
                    f"{100 * static.hit_rate:.0f} %), {best.prefetch_per_token:.2f} prefetches/token, est. "
                    f"{best.ms_per_token:.2f} vs {static.ms_per_token:.2f} ms/token static, {100 * gain:.0f} % faster "
                    f"({scored})")
