"""MTP drafts only while they pay: drafting turns itself off when acceptance stays below break-even, and back on
when a periodic probe finds it recovered.

An MTP step (draft 1) costs t_mtp and emits 1 + a tokens on average (a: acceptance); a plain step costs t_plain
and emits one. Drafting pays when (1 + n_draft * a) / t_mtp > 1 / t_plain, so the break-even acceptance is
a* = (t_mtp / t_plain - 1) / n_draft. Both step times are measured here, on this machine, model and context:
a few plain steps at the start of the first reply (and two more every `recalibrate` MTP steps, as the context
grows), the MTP steps as they run. With the slots on a GPU it is about 35 % at draft 1 (docs/performance.md); on
a CPU the verify batch costs nearly two plain steps, so drafting rarely pays there.

Off, the engine decodes plain steps and after `probe_every` tokens tries `probe_steps` MTP steps (the gap doubles
after each probe that fails, up to `probe_max`): the first feeds the draft context the rows it missed (kept
target states, one batch), all measure acceptance again. Every
step, plain or MTP, emits the target's own tokens (greedy: its argmax; sampled: its distribution), so switching
never changes the text (tests/engine/test_mtp_auto.py).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from typing import Callable

import numpy as np

from ..llm.mtp import MTP

ON, OFF, PROBE = "on", "off", "probe"


@dataclasses.dataclass
class AdaptiveMTP:
    mtp: MTP
    sample: Callable[[np.ndarray], int]          # the engine's sampler of this reply (argmax: greedy)
    window: int = 32                             # drafted steps whose acceptance decides
    probe_every: int = 64                        # plain tokens before the first probe once off; doubles after
    probe_max: int = 512                         # each probe that fails, up to this
    probe_steps: int = 8                         # MTP steps per probe
    calibrate: int = 4                           # plain steps that time a plain step before the first draft
    recalibrate: int = 256                       # MTP steps between two more timed plain steps
    margin: float = 0.05                         # a probe must beat break-even by this much to turn drafting on
    fixed_break_even: float | None = None        # a given break-even instead of the measured one
    state: str = ON
    switches: int = 0                            # on -> off and off -> on changes so far
    _acc: deque = dataclasses.field(default_factory=lambda: deque(maxlen=32), repr=False)  # (drafted, accepted)
    _t_plain: deque = dataclasses.field(default_factory=lambda: deque(maxlen=16), repr=False)
    _t_mtp: deque = dataclasses.field(default_factory=lambda: deque(maxlen=16), repr=False)
    _plain_due: int = 0                          # timed plain steps still to do
    _since_cal: int = 0                          # MTP steps since the last timed plain step
    _since_probe: int = 0                        # plain tokens since drafting went off or the last probe
    _probe_gap: int = 0                          # plain tokens before the next probe
    _probe_left: int = 0
    _skip_timing: bool = False                   # the first MTP step after plain ones also feeds their rows

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Back to the start: drafting on, nothing measured (`bench app` starts each side from here)."""
        self.state, self.switches = ON, 0
        self._acc = deque(maxlen=self.window)
        self._t_plain.clear()
        self._t_mtp.clear()
        self._plain_due, self._since_cal, self._since_probe, self._probe_left = self.calibrate, 0, 0, 0
        self._probe_gap = self.probe_every
        self._skip_timing = False

    # -- measurements -----------------------------------------------------------------------------------------

    # the UI thread reads these while the generating thread steps: tuple() copies a deque in one C call

    @property
    def acceptance(self) -> float | None:
        acc = tuple(self._acc)
        drafted = sum(d for d, _ in acc)
        return sum(a for _, a in acc) / drafted if drafted else None

    @property
    def break_even(self) -> float | None:
        if self.fixed_break_even is not None:
            return self.fixed_break_even
        t_plain, t_mtp = tuple(self._t_plain), tuple(self._t_mtp)
        if not t_plain or not t_mtp:
            return None
        plain = statistics.median(t_plain)
        if plain <= 0:                                  # a clock too coarse to time a step: nothing measured
            return None
        ratio = statistics.median(t_mtp) / plain
        return max(0.0, (ratio - 1.0) / self.mtp.n_draft)

    def line(self) -> str:
        """For the inspector: the state and why, e.g. "MTP off (accept 12 % < 35 %; probe in 40 tokens)".

        Every figure is a real percentage: the acceptance is clamped to 0..100 %, a break-even of 0 or less reads
        0 % (a draft step costs no more than a plain one: drafting always pays), one over 100 % is said in words
        (not even all drafts accepted would pay; a measured one was seen at 2772 %). The sign compares the figures
        now, not when the state was decided: the step times keep changing while drafting is off, so an off state
        can meet a break-even that acceptance now clears (it said "12 % < 0 %"); the probe decides again."""
        if self.state == ON:
            return f"MTP on ({_why(self.acceptance, self.break_even)})"
        probing = "; probing" if self.state == PROBE else \
            f"; probe in {max(0, self._probe_gap - self._since_probe)} tokens"
        return f"MTP off ({_why(self.acceptance, self.break_even)}{probing})"

    # -- stepping ---------------------------------------------------------------------------------------------

    def step(self, history: list[int], x: int, temperature: float = 0.0,
             rng: np.random.Generator | None = None, top_p: float = 1.0) -> list[int]:
        """As MTP.step: decodes x and returns [x, accepted drafts..., next]; history gets all but the last."""
        if self._plain_due > 0 or self.state == OFF:
            return self._plain(history, x)
        st = self.mtp.stats
        d0, a0 = st.drafted, st.accepted
        t0 = time.perf_counter()
        out = self.mtp.step(history, x, temperature, rng, top_p)
        dt = time.perf_counter() - t0
        if not self._skip_timing:
            self._t_mtp.append(dt)
        self._skip_timing = False
        if st.drafted > d0:
            self._acc.append((st.drafted - d0, st.accepted - a0))
        self._since_cal += 1
        if self._since_cal >= self.recalibrate:
            self._since_cal, self._plain_due = 0, 2
        if self.state == PROBE:
            self._probe_left -= 1
            if self._probe_left <= 0:
                self._decide_probe()
        else:
            self._decide_on()
        return out

    def _plain(self, history: list[int], x: int) -> list[int]:
        ctx = self.mtp.target
        t0 = time.perf_counter()
        ctx.decode([x])
        history.append(x)
        nxt = self.sample(ctx.logits())
        self._t_plain.append(time.perf_counter() - t0)
        self._skip_timing = True
        if self._plain_due > 0:
            self._plain_due -= 1
        elif self.state == OFF:
            self._since_probe += 1
            if self._since_probe >= self._probe_gap:
                self.state, self._probe_left, self._since_probe = PROBE, self.probe_steps, 0
                self._acc.clear()
        return [x, nxt]

    def _decide_on(self) -> None:
        acc, be = self.acceptance, self.break_even
        if len(self._acc) >= self.window and acc is not None and be is not None and acc < be:
            self.state, self._since_probe = OFF, 0
            self.switches += 1

    def _decide_probe(self) -> None:
        acc, be = self.acceptance, self.break_even
        if acc is not None and be is not None and acc >= be + self.margin:
            self.state, self._probe_gap = ON, self.probe_every
            self.switches += 1
        else:
            self.state, self._since_probe = OFF, 0
            self._probe_gap = min(2 * self._probe_gap, self.probe_max)


def _pct(x: float, digits: int = 0) -> str:
    """A share 0..1 as a percentage, clamped to 0..100 %."""
    return f"{100 * min(1.0, max(0.0, x)):.{digits}f} %"


def _why(acc: float | None, be: float | None) -> str:
    """Acceptance against break-even, for AdaptiveMTP.line(): bounded figures, the undefined ones said in words."""
    if be is not None and math.isnan(be):
        be = None
    if acc is None:
        return "measuring" if be is None else f"measuring acceptance, break-even {_pct(be)}"
    if be is None:
        return f"accept {_pct(acc)}, measuring break-even"
    if be > 1.0:                                   # even every draft accepted would not pay
        return f"accept {_pct(acc)}, break-even over 100 %: drafts cannot pay"
    if acc >= be:
        return f"accept {_pct(acc)} ≥ {_pct(be)}"
    digits = 1 if _pct(acc) == _pct(be) else 0     # "35 % < 35 %" once rounded: one decimal shows the gap
    return f"accept {_pct(acc, digits)} < {_pct(be, digits)}"
