"""The cost model against what the GPU box measured: the first-run calibrations recorded there (an H100, 16 and 6
threads, the 30B-A3B shape, experts pinned) and the ms/token of static, fetch, fetch-split and hybrid measured in
the same runs on uniform replayed routing (tests/fixtures/h100-2026-12-06-first-run.toml). The simulator, run on
the same rows with the same plans as `bench repick` ran them, must find the fastest of static, fetch and fetch-split
as measured (fetch-split in every cell there; static beat fetch at 16 threads) and predict each policy within 25 %
(the aim is 10 %: docs/performance.md lists the rows still off)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from moeslots.engine.machine import calibrate
from moeslots.engine.native import replay
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.native.tier import masks
from moeslots.profiles.costs import CostModel
from moeslots.profiles.hybrid import ENGINE, FETCH, FETCH_SPLIT, simulate_hybrid
from moeslots.profiles.plan import plan_from_counts
from moeslots.profiles.simulate import layer_counts

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h100-2026-12-06-first-run.toml"
MECH = {"static": ENGINE, "hybrid": ENGINE, "fetch": FETCH, "fetch-split": FETCH_SPLIT}
N_EXPERT, LAYERS, K, PROFILE_ROWS, N = 128, list(range(48)), 8, 1024, 64


def _recorded() -> tuple[dict[int, CostModel], list[dict]]:
    d = tomllib.loads(FIXTURE.read_text())
    costs = {}
    for entry in d["calibration"].values():
        c = calibrate.Calibration(**{k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()})
        costs[c.threads] = c.cost_model(pinned=True, threads=c.threads)
    return costs, d["measured"]


def _predict(cost: CostModel, slots: int, policy: str, tier: int) -> float:
    """`bench repick`'s simulator column for one row: its rows, plan and warm-up."""
    full = replay.uniform(PROFILE_ROWS + N + 16, len(LAYERS), N_EXPERT, K, seed=7).per_layer(LAYERS)
    plan = SlotPlan(plan_from_counts(layer_counts(full[:PROFILE_ROWS], LAYERS, N_EXPERT), slots, LAYERS))
    W, P = full[PROFILE_ROWS + 12:PROFILE_ROWS + 16], full[PROFILE_ROWS + 16:PROFILE_ROWS + 16 + N]
    core, first = masks(plan, tier, N_EXPERT)
    return simulate_hybrid(np.concatenate([W, P]), core, tier, cost, initial=first, mech=MECH[policy],
                           warmup=len(W)).ms_per_token


@pytest.mark.parametrize("threads", [16, 6])
def test_the_cost_model_ranks_the_policies_as_measured(threads: int) -> None:
    costs, measured = _recorded()
    cost = costs[threads]
    assert cost.fetch_base_ms > 0 and cost.share_cpu_gbps > 0        # the GPU-stepped costs were measured there
    for slots in (32, 64):
        rows = [r for r in measured if r["threads"] == threads and r["slots"] == slots]
        got = {r["policy"]: _predict(cost, slots, r["policy"], r["tier"]) for r in rows}
        real = {r["policy"]: r["ms"] for r in rows}
        three = ("static", "fetch", "fetch-split")              # (hybrid at 6 threads, 32 slots: predicted 20 % fast)
        assert min(three, key=got.get) == min(three, key=real.get) == "fetch-split", (got, real)
        for p in real:
            assert abs(got[p] / real[p] - 1) < 0.25, (threads, slots, p, got[p], real[p])
        if threads == 16:                                            # the order of the other two, measured apart
            assert (got["static"] < got["fetch"]) == (real["static"] < real["fetch"]), (got, real)
