"""The what-if line follows the slots in force: after a slot change it is the new plan's, at once (it once kept
the old slot count until the next reply)."""

from __future__ import annotations

from pathlib import Path

from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.runtime.engine import Engine, EngineConfig, Message


def test_the_what_if_line_is_for_the_slots_in_force(tiny_glm: Path) -> None:
    e = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, max_tokens=24, mtp=False))
    try:
        f = e.model.facts
        layers = [il for il in f.moe_layers if il < f.n_layer]
        e.set_slots(SlotPlan.uniform(layers, 8, f.n_expert))
        for _ in e.chat([Message("user", "route some tokens")]):
            pass
        assert e.snapshot().whatif.startswith("what-if @8: static ") and " est." not in e.snapshot().whatif
        e.set_slots(SlotPlan.uniform(layers, 4, f.n_expert))
        line = e.snapshot().whatif
        assert line.startswith("what-if @4: static ") and " % est." in line, line     # simulated, said so
        e.set_slots(0)
        assert e.snapshot().whatif == ""                                               # no slots: nothing to compare
    finally:
        e.close()
