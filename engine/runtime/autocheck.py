"""`--policy auto` checks its choice against what the chat measures: when the chosen policy decodes more than 15 %
slower than predicted over CHECK_TOKENS decode tokens, or the runner-up (the fastest other mechanism the simulator
scored) was predicted within 10 % of it (closer than the cost model can tell apart: on the GPU box its predictions
are off by up to 10 %, and a near tie went the wrong way by 8 %), the runner-up takes over between replies for as
many tokens, and the faster of the two as measured stays. Pure bookkeeping: the
engine times its replies and applies a switch (engine.residency); one switch out and at most one back, then settled.
"""

from __future__ import annotations

import dataclasses

from ...profiles.policy import Decision

CHECK_TOKENS = 256      # decode tokens a policy is measured over (a few replies)
SLOW = 0.85             # measured speed under this share of the predicted one: try the runner-up
TIE = 0.10              # the runner-up predicted within this share of the choice: try it as well


@dataclasses.dataclass
class Trial:
    policy: str
    tier: int
    predicted_ms: float
    tokens: int = 0
    seconds: float = 0.0

    @property
    def measured_ms(self) -> float:
        return 1e3 * self.seconds / self.tokens if self.tokens else 0.0

    def says(self) -> str:
        return f"{self.policy} {self.measured_ms:.2f} ms/token measured (predicted {self.predicted_ms:.2f})"


class AutoCheck:
    """The state of one `auto` decision's check: "checking" the choice, "trying" the runner-up, "settled"."""

    def __init__(self, decision: Decision, tokens: int | None = None, slow: float = SLOW,
                 tie: float | None = None) -> None:
        self.first = Trial(decision.policy, decision.tier, decision.predicted_ms)
        ru = decision.runner_up()
        self.second = Trial(ru.policy, ru.tier, ru.ms_per_token) if ru is not None else None
        self.tokens, self.slow = tokens or CHECK_TOKENS, slow
        self.tie_share = tie = TIE if tie is None else tie
        self.near_tie = self.second is not None and self.second.predicted_ms <= (1 + tie) * self.first.predicted_ms
        self.state = "checking" if self.first.predicted_ms > 0 else "settled"
        self.line = ""                       # the last verdict, for the user

    @property
    def current(self) -> Trial:
        return self.second if self.state == "trying" and self.second is not None else self.first

    def timed(self, tokens: int, seconds: float) -> tuple[str, int] | None:
        """A reply decoded `tokens` in `seconds` under the current policy; returns the (policy, tier) to switch to
        before the next reply, or None."""
        if self.state == "settled" or tokens <= 0 or seconds <= 0:
            return None
        t = self.current
        t.tokens += tokens
        t.seconds += seconds
        if t.tokens < self.tokens:
            return None
        if self.state == "checking":
            slow = t.measured_ms * self.slow > t.predicted_ms
            if (slow or self.near_tie) and self.second is not None:
                self.state = "trying"
                why = (f"over {100 * (1 - self.slow):.0f} % slower than predicted" if slow else
                       f"and the runner-up was predicted within {100 * self.tie_share:.0f} % of it")
                self.line = (f"auto: {t.says()}, {why}: trying the runner-up, {self.second.policy}, for "
                             f"{self.tokens} tokens")
                return self.second.policy, self.second.tier
            self.state = "settled"
            self.line = f"auto: {t.says()}" + (": kept" if not slow else ": kept (no runner-up to try)")
            return None
        self.state = "settled"
        a, b = self.first, t
        if b.measured_ms < a.measured_ms:
            self.line = f"auto: kept the runner-up, {b.says()}, over {a.says()}"
            return None
        self.line = f"auto: back to {a.policy}: {a.says()}, the runner-up {b.says()}"
        return a.policy, a.tier
