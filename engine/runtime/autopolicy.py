"""`--policy auto` for one Engine: the residency policy of each plan, chosen by simulating the chat's routing (the
profile, or before there is one the first prompt's) under this machine's costs (profiles.policy.decide_policy), the
costs measured by themselves the first time this model shape runs here (engine.autocal), and the choice checked
against the measured decode speed (engine.autocheck), the runner-up tried between replies when it falls short.
Residency asks it for (policy, tier, why) when a plan goes in; the Engine tells it how fast each reply decoded."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...profiles.policy import Decision, decide_policy
from ...profiles.trace import Trace, TraceError, from_ring, read_csv
from ..llm.model import default_threads
from ..machine import autocal, calibrate
from ..native import lib as native
from .autocheck import AutoCheck

if TYPE_CHECKING:
    from .engine import Engine


class AutoPolicy:
    def __init__(self, eng: "Engine") -> None:
        self.eng = eng
        self.routing: Trace | None = None                 # the first prompt's routing, until there is a profile
        self.decision: Decision | None = None
        self.check: AutoCheck | None = None
        self._forced: tuple[str, int] | None = None       # the check's switch, for the next plan
        self.pending: tuple[str, int] | None = None       # a switch to make before the next reply

    def prompt_routing(self, rows: np.ndarray) -> None:
        """The first prompt's routing rows [pos (negative), layer, ids...], scored as if decoded (no profile yet)."""
        r = rows.copy()
        r[:, 0] = np.abs(r[:, 0])                         # (prompt rows are negative; later decode rows are not)
        self.routing = from_ring(r, {"n_expert": str(self.eng.model.facts.n_expert)})

    def decide(self, slots: int) -> tuple[str, int, str]:
        """(policy, tier slots, why) for a plan of `slots` per layer."""
        if self._forced is not None:                       # the check's switch: the same plan, another policy
            (pol, tier), self._forced = self._forced, None
            return pol, tier, self.check.line if self.check is not None else pol
        self.decision, self.check = None, None
        eng = self.eng
        if slots <= 0:
            return "static", 0, "static (no slots)"
        routing = self._routing()
        if isinstance(routing, str):
            return "static", 0, f"static ({routing})"
        gpu = not eng.cfg.pack_host and bool(native.gpus())
        self._calibrate(slots, gpu)
        cost, source = eng.cost_model()
        pinned = not eng.model.opts.use_mmap
        # fetch-split only where the calibration the costs come from measured its share (a stale one too, where the
        # first-run calibration is off: the costs are that one's)
        share = calibrate.share_measured(shape=autocal.shape_of(eng.model.facts), threads=self._threads(),
                                         pinned=pinned)
        try:
            d = decide_policy(routing, slots, cost, fetch=gpu and pinned, share=share)
        except (TraceError, ValueError) as e:
            return "static", 0, f"static ({e})"
        self.decision, self.check = d, AutoCheck(d)
        return d.policy, d.tier, f"{d.why} [{source}]"

    def timed(self, tokens: int, seconds: float) -> str:
        """A reply's decode speed under the current choice; a switch it calls for waits in `pending` for the next
        reply (Engine). Returns the check's new verdict line, or ""."""
        if self.check is None or not self.eng.cfg.policy.is_auto:
            return ""
        before = self.check.line
        switch = self.check.timed(tokens, seconds)
        if switch is not None:
            self.pending = switch
        return self.check.line if self.check.line != before else ""

    def take_pending(self) -> bool:
        """Before the next reply: a pending switch becomes the next plan's policy. True when there was one."""
        if self.pending is None:
            return False
        self._forced, self.pending = self.pending, None
        return True

    def _threads(self) -> int:
        return self.eng.cfg.threads or default_threads()

    def _routing(self) -> "Trace | str":
        """The routing to score: the profile, else the first prompt's; or why there is none."""
        eng = self.eng
        if eng.cfg.profile is not None:
            try:
                return read_csv(Path(eng.cfg.profile))
            except TraceError as e:
                return str(e)
        if self.routing is not None:
            return self.routing
        return "no routing to simulate yet: decided at the first prompt"

    def _calibrate(self, slots: int, gpu: bool) -> None:
        """The first-run calibration of this model shape, when this machine has none and it is wanted (a GPU holds
        the slots, or EngineConfig.calibrate = "always")."""
        eng = self.eng
        how = eng.cfg.calibrate
        if how == "off" or (how == "first-run" and not gpu):
            return
        if autocal.stored(eng.model, self._threads()) is not None:
            return
        c = autocal.run(eng.model, threads=self._threads(), slots=slots, pack_host=eng.cfg.pack_host,
                        log=eng.say_progress)
        eng.say_progress("")
        eng.notices.append(f"calibrated this machine for --policy auto in {c.seconds:.0f} s (first run of this model "
                           "shape here; `moeslots doctor` shows it)" + (f"; not measured: {c.unmeasured}"
                                                                         if c.unmeasured else ""))
