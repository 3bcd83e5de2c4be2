"""`--slots auto` leaves room for the spare slab per layer that overlapped re-pick copies need: the cache allocates
S + 1 slabs per layer then, so counting S ate the 1 GiB margin. (The dynamic tier writes into its own slots: no
spare.)"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from moeslots.engine.api import EngineConfig
from moeslots.engine.llm.model import LoadOptions, Model
from moeslots.engine.runtime import slot_plans as slots_mod
from moeslots.engine.runtime.engine import Engine


def test_auto_counts_a_spare_slab_when_slots_move(tiny_glm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        f = m.facts
        layers = len(slots_mod.trunk_layers(m))
        free = (1 << 30) + 5 * layers * f.slab_bytes                  # 5 slabs per layer past the margin
        monkeypatch.setattr(slots_mod.native, "gpus", lambda: [types.SimpleNamespace(free=free)])
        assert slots_mod.slot_count(m, "auto") == 5
        assert slots_mod.slot_count(m, "auto", spare=True) == 4


@pytest.mark.parametrize("cfg,moves", [({}, False), ({"policy": "hybrid"}, False), ({"repick_every": 16}, True),
                                       ({"repick_every": 16, "repick_overlap": False}, False)])
def test_the_engine_asks_for_the_spare_when_its_slots_move(tiny_glm: Path, cfg: dict, moves: bool) -> None:
    eng = Engine(EngineConfig(model=str(tiny_glm), mtp=False, auto_profile=False, **cfg))
    try:
        assert eng.residency.may_move() is moves
    finally:
        eng.close()
