"""A fetch-split share's costs fitted to measured decodes, layer by layer.

A GPU-stepped tier with a CPU share (`--policy fetch-split`) costs, per layer, the larger of its copies plus the
GPU's own work beside the share (share_overlap_ms) and its CPU part, less that work, plus share_ms
(profiles.split.fetch_layers_ms). One decode of known routing (a calibration's) gives the total; the simulator gives
each layer's copies and CPU misses exactly as the engine split them, so the fit is made per layer, not on the token's
sums (fitted on the sums, the CPU's part was charged in every layer, also where the copies led, and the model
predicted its own calibration 3-4 % slow).

The fit (over one or more such decodes, on average; none where they come within NOISE of the unfitted prediction):
with the CPU at its own streaming rate (cpu_gbps) and no overlap, the model predicts the decode too slow
where the share hides behind the GPU's work: then share_overlap_ms is the least overlap that predicts it (or, where
even a wholly hidden share predicts it slow, the least that hides the share wholly; at most the GPU's fixed part per
layer, fetch_base_ms / layers). Where that prediction is too fast instead, the share ran slower than
the CPU streams (a share of one to three experts a layer, the GPU reading the same DRAM): then share_cpu_gbps is the
rate that predicts it, with no overlap.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from .costs import CostModel
from .hybrid import FETCH_SPLIT, Tier

STEPS = 60          # bisection steps (the interval shrinks 2^60-fold: far below any measurement's noise)
NOISE = 0.02        # a decode within 2 % of the unfitted prediction is not fitted: two 16-token share decodes of the
                    # same split differed by 3 % on the H100 box, about the whole room an overlap has (3-5 %)
SLOWEST = 1 / 50    # the slowest share rate fitted, as a fraction of the CPU's streaming rate


@dataclasses.dataclass(frozen=True)
class Steps:
    """A decode's steps as the simulator splits them: per step its tokens, resident picks, and per layer copies and
    CPU misses (a batch that does not fit the tier: split, read only)."""
    n: list[int]
    gpu: list[int]
    up: list[np.ndarray]
    cpu: list[np.ndarray]
    split: list[bool]

    @property
    def tokens(self) -> int:
        return sum(self.n)

    @property
    def copies(self) -> int:
        return int(sum(int(u.sum()) for u in self.up))

    @property
    def cpu_misses(self) -> int:
        return int(sum(int(c.sum()) for c in self.cpu))


@dataclasses.dataclass(frozen=True)
class ShareFit:
    overlap_ms: float       # share_overlap_ms fitted (0: none)
    cpu_gbps: float         # share_cpu_gbps fitted (0: the CPU's own rate)
    predicted_ms: float     # the decode as the fitted costs predict it, per token
    unfitted_ms: float      # as predicted with the CPU at its own rate and no overlap
    measured_ms: float

    @property
    def within_noise(self) -> bool:
        return abs(self.measured_ms / self.unfitted_ms - 1) <= NOISE

    def line(self) -> str:
        what = (f"the GPU's work beside the share {1000 * self.overlap_ms:.1f} us/layer" if self.overlap_ms > 0
                else f"the share's CPU at {self.cpu_gbps:.1f} GB/s" if self.cpu_gbps > 0
                else "the CPU at its own rate, no overlap" + (" (within the decodes' noise)" if self.within_noise
                                                              else ""))
        return (f"fetch-split share fitted per layer: {what} (measured {self.measured_ms:.2f} ms/token, predicted "
                f"{self.predicted_ms:.2f}; {self.unfitted_ms:.2f} unfitted)")


class _Recording(Tier):
    """The rule, keeping what each step's cost was computed from."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.steps = Steps([], [], [], [], [])

    def step_ms(self, n_tokens: int, gpu_picks: int, up: np.ndarray, c: np.ndarray, split: bool = False) -> float:
        s = self.steps
        s.n.append(n_tokens)
        s.gpu.append(gpu_picks)
        s.up.append(up.copy())
        s.cpu.append(c.copy())
        s.split.append(split)
        return super().step_ms(n_tokens, gpu_picks, up, c, split)


def share_steps(P: np.ndarray, tier: int, cost: CostModel, *, initial: np.ndarray, warmup: int,
                core: np.ndarray | None = None) -> Steps:
    """One-token decodes of picks P [T, L, k] (the first `warmup` stepped, not kept) through a GPU-stepped tier of
    `tier` slots with a CPU share, split by `cost` as the engine splits it; initial: its first residents [L,
    n_expert]; core: the static slots beside it (None: every slot a tier)."""
    rule = _Recording(np.zeros_like(initial, bool) if core is None else core, tier, cost, initial=initial,
                      mech=FETCH_SPLIT)
    for t in range(P.shape[0]):
        rule.step(P[t])
    s = rule.steps
    return Steps(s.n[warmup:], s.gpu[warmup:], s.up[warmup:], s.cpu[warmup:], s.split[warmup:])


def predict_ms(steps: Steps, tier: int, cost: CostModel) -> float:
    """The steps' ms per token under `cost` (their split kept as it was)."""
    L = steps.up[0].size
    rule = Tier(np.zeros((L, 1), bool), tier, cost, mech=FETCH_SPLIT)
    total = sum(rule.step_ms(n, g, u, c, sp) for n, g, u, c, sp in zip(steps.n, steps.gpu, steps.up, steps.cpu,
                                                                         steps.split))
    return total / max(1, steps.tokens)


def _solve(f: Callable[[float], float], lo: float, hi: float, target: float) -> float:
    """x in [lo, hi] with f(x) = target, f non-increasing on [lo, hi] and f(lo) >= target >= f(hi)."""
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
    return (lo + hi) / 2


def fit_share(runs: Sequence[tuple[Steps, float]], tier: int, cost: CostModel) -> ShareFit:
    """share_overlap_ms or share_cpu_gbps (see the module's text) so that the share decodes `runs` (each its steps
    and its measured ms per token; the same split or not) are predicted as measured on average; cost: the runs'
    costs (their fixed part, fetch rate and share_ms measured)."""
    if not runs or any(not st.n or ms <= 0 for st, ms in runs):
        raise ValueError("a fit needs measured decodes of at least one step")
    measured = float(np.mean([ms for _, ms in runs]))

    def pred(c: CostModel) -> float:
        return float(np.mean([predict_ms(st, tier, c) for st, _ in runs]))

    own = dataclasses.replace(cost, share_cpu_gbps=0.0, share_overlap_ms=0.0)
    unfitted = pred(own)
    layers = runs[0][0].up[0].size
    y_max = cost.fetch_step_ms(layers) / max(1, layers)
    if abs(measured / unfitted - 1) <= NOISE:
        fitted = own                            # within the decodes' noise: nothing to fit
    elif unfitted > measured:
        def at_y(y: float) -> float:
            return pred(dataclasses.replace(own, share_overlap_ms=y))
        floor = at_y(y_max)                     # the share wholly hidden: the least the overlap can explain
        y = _solve(at_y, 0.0, y_max, max(measured, floor + 1e-9 * floor))      # the least overlap explaining it
        fitted = dataclasses.replace(own, share_overlap_ms=y if y > 1e-9 else 0.0)
    else:
        def at_g(x: float) -> float:            # x: the CPU's time per expert relative to its own rate's, falling
            return pred(dataclasses.replace(own, share_cpu_gbps=own.cpu_gbps / (1 / SLOWEST - x)))
        lo, hi = 0.0, 1 / SLOWEST - 1           # share_cpu from SLOWEST x cpu_gbps (x = 0) up to cpu_gbps
        if at_g(lo) <= measured:                # even the slowest rate leaves it unexplained: not the CPU's part
            fitted = own
        else:
            x = _solve(at_g, lo, hi, measured)
            fitted = dataclasses.replace(own, share_cpu_gbps=own.cpu_gbps / (1 / SLOWEST - x))
    return ShareFit(fitted.share_overlap_ms, fitted.share_cpu_gbps, pred(fitted), unfitted, measured)
