"""Choosing the re-pick interval (`--repick auto`): static and every interval simulated with the engine's rule
(profiles.simulate) and scored under a cost model (profiles.costs); at load from a profile (choose_repick), and as
the chat goes on from its own routing (choose_repick_from)."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from .costs import CostModel
from .plan import plan_from_counts
from .simulate import layer_counts, reelect, resident_from_plan, static_hits, token_matrix
from .trace import Trace, TraceError

REPICK_CHOICES = (0, 1, 16, 100, 500)


@dataclasses.dataclass(frozen=True)
class Picks:
    """Decode picks already as a token matrix: P [tokens, len(layers), k], column j = model layer layers[j] (what
    token_matrix makes of a trace). The choosers take one where a caller holds the matrix (the bench, scripts)."""
    P: np.ndarray
    layers: list[int]
    n_expert: int


def _picks(t: "Trace | Picks") -> Picks:
    if isinstance(t, Picks):
        return t
    layers, P = token_matrix(t)
    return Picks(P, layers, max(t.n_expert, int(P.max()) + 1))


def choose_repick(trace: "Trace | Picks", slots: int, cost: CostModel | None = None, *, max_swaps: int = 4,
                  margin: float = 0.25, choices: Sequence[int] = REPICK_CHOICES,
                  holdout: float = 0.5, min_gain: float = 0.05) -> tuple[int, str]:
    """The re-pick interval (0 = static) with the lowest estimated ms/token under this cost model, simulated with
    the engine's rule (plan.elect, at most `max_swaps` per layer, `margin`). The static plan comes from the first
    part of the trace and every policy is scored on the last `holdout` of it: in the app the plan comes from a
    profile recorded earlier and the text decoded later drifts away from it, and scoring in-sample would hide that
    drift (the static plan would be the best static set for the very tokens scored). Traces too short to split
    (under 128 tokens per part) are scored in-sample. A re-pick interval is chosen only when it is estimated at
    least `min_gain` faster than static: smaller gains are below what the cost model resolves (measured cells were
    -10 to +29 % off its ms/token) and re-picking moves bytes for them.
    Deterministic for a given trace, slots and cost. Returns (N, one line saying why)."""
    cost = cost or CostModel()
    pk = _picks(trace)
    P, layers, n_expert = pk.P, pk.layers, pk.n_expert
    T = P.shape[0]
    cut = int(round(T * (1 - holdout)))
    split = 0 < holdout < 1 and min(cut, T - cut) >= 128
    train, P = (P[:cut], P[cut:]) if split else (P, P)
    initial = resident_from_plan(plan_from_counts(layer_counts(train, layers, n_expert), slots, layers), layers,
                                  n_expert)
    scored = (f"plan from the profile's first {cut} tokens, scored on its last {T - cut}" if split
              else f"profile of {T} tokens scored in-sample")
    return _verdict(P, initial, slots, n_expert, cost, choices, max_swaps, margin, min_gain, scored)


def choose_repick_from(trace: "Trace | Picks", plan: Mapping[int, Sequence[int]], cost: CostModel | None = None, *,
                       last: int | None = None, current: int = 0, whole: bool = False, max_swaps: int = 4,
                       margin: float = 0.25, choices: Sequence[int] = REPICK_CHOICES,
                       min_gain: float = 0.05) -> tuple[int, str]:
    """choose_repick for a session in progress (`--repick auto` re-decides as the chat goes on): static is the
    resident `plan` the app held when the last `last` decode tokens of `trace` began; every interval starts from it
    and is scored on those tokens. They came after the plan was fixed, so the score is out of sample, and it sees
    this session's drift, which a profile recorded earlier cannot. Intervals longer than half the scored tokens are
    left out (they would fire at most once: static again, judged on too little). Hysteresis: starting to re-pick
    needs an estimated `min_gain`; while re-picking (`current` > 0) any estimated gain keeps it on. Stopping
    freezes a set elected from the last 64 tokens, which is a worse static set than a profile's: over the bundled
    chat trace at 64 slots, leaving re-pick 16 for gains under 5 % left live auto behind plain static
    (scripts/live_auto_sim.py). whole=True: the trace must hold all `last` tokens, else ValueError (with fewer,
    the scored tokens would not begin where `plan` was held: a long prompt can push decode rows out of the ring)."""
    cost = cost or CostModel()
    pk = _picks(trace)
    P, layers = pk.P, pk.layers
    if whole and last is not None and P.shape[0] < last:
        raise TraceError(f"the routing ring holds {P.shape[0]} of the last {last} decode tokens")
    start = max(0, P.shape[0] - last) if last is not None else 0      # earlier tokens: the first window's history
    n_expert = max([pk.n_expert] + [max(v, default=-1) + 1 for v in plan.values()])
    T = P.shape[0] - start
    slots = max((len(v) for v in plan.values()), default=0)
    initial = resident_from_plan({il: tuple(v) for il, v in plan.items()}, layers, n_expert)
    choices = [n for n in choices if n == 0 or n <= T // 2]
    return _verdict(P, initial, slots, n_expert, cost, choices, max_swaps, margin, min_gain if current == 0 else 0.0,
                    f"this session's last {T} tokens, from the plan they began with", start=start, current=current)


def _verdict(P: np.ndarray, initial: np.ndarray, slots: int, n_expert: int, cost: CostModel,
             choices: Sequence[int], max_swaps: int, margin: float, min_gain: float,
             scored: str, start: int = 0, current: int = 0) -> tuple[int, str]:
    """Score static and every re-pick interval on P[start:] from the resident set `initial`, then decide
    (choose_repick). While re-picking every `current` tokens, a `current` that ties static is kept: re-picking
    that swapped nothing cost nothing, and it still follows the drift to come."""
    T, L, k = P.shape
    results = []
    for n in sorted(set(choices) | {0}):
        if n == 0:
            hr, up = static_hits(P[start:], initial)[0], 0.0
        else:
            hr, up = reelect(P, slots, n_expert, n, 64, initial, max_swaps=max_swaps, margin=margin, start=start)
        cpu = (1 - hr) * L * k
        results.append((cost.ms_per_token(L * k - cpu, cpu, up), n, hr, up))
    static = results[0]
    best = min((r for r in results if r[1] != 0), key=lambda r: (r[0], r[1]), default=static)
    ms, n, hr, up = best
    gain = 1 - ms / static[0] if static[0] > 0 else 0.0
    tie = next((r for r in results if r[1] == current), None) if current else None
    if tie is not None and gain <= 0 and tie[0] <= static[0]:
        return current, (f"re-pick every {current} tokens kept: it ties static on these tokens ({100 * tie[2]:.0f} "
                         f"% hits, est. {tie[0]:.2f} ms/token) ({scored})")
    if n == 0 or gain <= 0 or gain < min_gain:              # a tie is static: nothing to upload for
        extra = (f"the best re-pick (every {n}) would save {100 * gain:.1f} %, under {100 * min_gain:.0f} %"
                 if n and gain > 0 else f"re-picking would not pay back its uploads at {cost.pcie_gbps:.1f} GB/s "
                 f"PCIe vs {cost.cpu_gbps:.1f} GB/s CPU")
        return 0, (f"static: {100 * static[2]:.0f} % hits at {slots} slots, est. {static[0]:.2f} ms/token; {extra} "
                   f"({scored})")
    return n, (f"re-pick every {n} tokens: {100 * hr:.0f} % hits (static {100 * static[2]:.0f} %), "
               f"{up * cost.slab_mb:.2f} MB uploaded/token, est. {ms:.2f} vs {static[0]:.2f} ms/token static, "
               f"{100 * gain:.0f} % faster ({scored})")
