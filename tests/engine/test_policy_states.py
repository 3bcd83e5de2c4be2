"""F3 (re-picks), Ctrl+S (slots) and the residency policy as one state machine, through the Engine: re-picks set
the policy asked for aside (static while they run: both move slots) and F3 off brings it back with its tier at the
next reply; a slot change is never refused for "both move slots" whatever the order of the keys. One test per
transition."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.runtime.engine import Engine, EngineConfig, Message, TextDelta

START = SlotPlan.uniform([1, 2], 6, 16)


def _reply(e: Engine, ask: str) -> str:
    e.new_chat()
    return "".join(ev.text for ev in e.chat([Message("user", ask)]) if isinstance(ev, TextDelta))


@pytest.fixture()
def hybrid(tiny_glm: Path):
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=16, mtp=False, policy="hybrid",
                            slots=START))
    yield e
    e.close()


def _state(e: Engine) -> tuple[str, bool, int]:
    return e.cfg.policy.name, e.residency.tier is not None, e.cfg.repick_every


def test_f3_on_ends_the_tier_and_f3_off_brings_it_back(hybrid: Engine) -> None:
    assert _state(hybrid) == ("hybrid", True, 0)
    hybrid.set_repick(16)                                           # F3 on: re-picks win, the tier ends
    assert _state(hybrid) == ("static", False, 16)
    line = hybrid.set_repick(0)                                     # F3 off: hybrid again...
    assert hybrid.cfg.policy.name == "hybrid" and "--policy hybrid again from the next reply" in line
    _reply(hybrid, "tell me about the experts")                     # ...its tier from the next reply
    assert _state(hybrid) == ("hybrid", True, 0) and hybrid.snapshot().policy == "hybrid"


def test_slots_0_then_f3_then_slots(hybrid: Engine) -> None:
    """The reported sequence: Ctrl+S 0, F3, then Ctrl+S (0 or a number): each accepted, static with re-picks."""
    hybrid.set_slots(0)
    assert _state(hybrid) == ("hybrid", False, 0)
    hybrid.set_repick(16)
    assert _state(hybrid) == ("static", False, 16)
    hybrid.set_slots(0)
    hybrid.set_slots(SlotPlan.uniform([1, 2], 5, 16))
    assert _state(hybrid) == ("static", False, 16) and hybrid.state.plan.slots_per_layer == 5
    hybrid.set_repick(0)                                            # F3 off: the tier with the next reply
    _reply(hybrid, "and more")
    assert _state(hybrid) == ("hybrid", True, 0)


def test_slots_change_while_repicking_keeps_repicks(hybrid: Engine) -> None:
    hybrid.set_repick(16)
    hybrid.set_slots(SlotPlan.uniform([1, 2], 4, 16))
    assert _state(hybrid) == ("static", False, 16)
    assert len(_reply(hybrid, "tell me")) > 0


def test_slots_change_under_the_policy_keeps_its_tier(hybrid: Engine) -> None:
    hybrid.set_slots(SlotPlan.uniform([1, 2], 8, 16))
    assert _state(hybrid) == ("hybrid", True, 0) and hybrid.residency.tier is not None \
        and hybrid.residency.tier.tier == 2


def test_f3_off_with_no_slots_waits_for_a_plan(hybrid: Engine) -> None:
    hybrid.set_slots(0)
    hybrid.set_repick(16)
    hybrid.set_repick(0)
    assert _state(hybrid) == ("hybrid", False, 0) and not hybrid.residency.restore_policy
    hybrid.set_slots(START)                                         # the next plan gets the tier
    assert _state(hybrid) == ("hybrid", True, 0)


def test_static_policy_f3_round_trip(tiny_glm: Path) -> None:
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=16, mtp=False, slots=START))
    try:
        assert e.set_repick(16).startswith("re-pick every 16") and _state(e) == ("static", False, 16)
        assert e.set_repick(0) == "no re-picks: static residency" and _state(e) == ("static", False, 0)
    finally:
        e.close()
