"""The host tier's route cost (engine.route_cost): static and the host tier that moves nothing, taking turns, on the
CPU engine; the per-layer median of the paired differences from known times; not measured where the tier moved
something; and it reaches the cost model."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeslots.engine.llm.model import LoadOptions, Model
from moeslots.engine.machine import calibrate, route_cost
from moeslots.engine.native.tier import NativeTier, TierCounts


def _moe(m: Model) -> list[int]:
    return [il for il in m.facts.moe_layers if il < m.facts.n_layer]


def test_the_route_is_measured_on_the_cpu_engine(tiny_glm: Path) -> None:
    logs: list[str] = []
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        rc = route_cost.route_cost(m, _moe(m), 8, 2, 12, True, logs.append)
    runs = [line.split(",")[0] for line in logs[:-1]]
    assert runs == ["static", "host tier", "host tier", "static", "static", "host tier"], logs    # taking turns
    assert logs[-1].startswith("the host tier's route: ") and "(2 layers with a tier)" in logs[-1], logs
    assert rc.route_ms >= route_cost.MIN_ROUTE_MS and rc.raw == tuple(logs)


def test_the_route_from_known_times(tiny_glm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paired differences 0.4, 0.2 and 9.0 ms (an outlier) over 2 layers: 0.2 ms a layer, the median's half."""
    times = iter([10.0, 10.4, 10.2, 10.0, 10.0, 19.0])       # static, tier / tier, static / static, tier
    monkeypatch.setattr(route_cost, "decode_ms", lambda ctx, toks: next(times))
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        rc = route_cost.route_cost(m, _moe(m), 8, 2, 12, True, lambda s: None)
    assert rc.route_ms == pytest.approx(0.4 / 2)


def test_a_tier_that_moved_something_is_not_measured(tiny_glm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Moving(NativeTier):
        def step(self, n_new: int = 1, *, force: bool = False) -> None:   # type: ignore[override]
            self.counts = TierCounts(uploads=3)

    monkeypatch.setattr(route_cost, "NativeTier", Moving)
    logs: list[str] = []
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        rc = route_cost.route_cost(m, _moe(m), 8, 2, 12, True, logs.append)
    assert rc.route_ms == 0.0 and "not measured (the tier uploaded 3 experts" in logs[-1], logs


def test_the_route_reaches_the_cost_model() -> None:
    c = calibrate.Calibration(machine="m", date="d", model="x", slab_mb=1.0, upload_pageable_gbps=1.0,
                              upload_pinned_gbps=2.0, cpu_gbps=3.0, base_ms=1.0, method="split", route_ms=0.02)
    assert c.cost_model(pinned=True).route_ms == c.cost_model().route_ms == 0.02
    assert "host tier's route 20 us/layer" in c.render()
