"""The cost model against what the GPU box measured: the first-run calibrations recorded there (an H100, 16 and 6
threads, the 30B-A3B shape, experts pinned) and the ms/token of static, fetch, fetch-split and hybrid measured in
the same runs on uniform replayed routing (tests/fixtures/h100-2026-12-06-first-run.toml). The simulator, run on
the same rows with the same plans as `bench repick` ran them, must find the fastest of static, fetch and fetch-split
as measured (fetch-split in every cell there; static beat fetch at 16 threads) and predict each policy within 25 %
(the aim is 10 %: docs/performance.md lists the rows still off). With the experts mmap'ed (a second run,
tests/fixtures/h100-2026-12-06-mmap.toml) the host tier's uploads come from pageable memory and add to the CPU's
work: the model must say so (hybrid there measured 44.7 ms/token where overlapped uploads would take 32.1), rank
static first at 6 threads and let `auto` choose it."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import numpy as np
import pytest

from moeslots.engine.machine import calibrate
from moeslots.engine.native import replay
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.native.tier import masks
from moeslots.profiles.costs import CostModel
from moeslots.profiles.hybrid import ENGINE, FETCH, FETCH_SPLIT, HybridResult, simulate_hybrid
from moeslots.profiles.plan import plan_from_counts
from moeslots.profiles.policy import decide_policy
from moeslots.profiles.repick import Picks
from moeslots.profiles.simulate import layer_counts

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h100-2026-12-06-first-run.toml"
PAGEABLE = FIXTURE.with_name("h100-2026-12-06-mmap.toml")
CHAT = Path(__file__).resolve().parents[2] / "profiles" / "data" / "moeslots-donor-qwen3-30b-a3b-chat-sampled.npz"
MECH = {"static": ENGINE, "hybrid": ENGINE, "fetch": FETCH, "fetch-split": FETCH_SPLIT}
N_EXPERT, LAYERS, K, PROFILE_ROWS, N = 128, list(range(48)), 8, 1024, 64


def _recorded(fixture: Path = FIXTURE, *, pinned: bool = True) -> tuple[dict[int, CostModel], list[dict]]:
    d = tomllib.loads(fixture.read_text())
    costs = {}
    for entry in d["calibration"].values():
        c = calibrate.Calibration(**{k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()})
        costs[c.threads] = c.cost_model(pinned=pinned, threads=c.threads)
    return costs, d["measured"]


def _rows() -> np.ndarray:
    return replay.uniform(PROFILE_ROWS + N + 16, len(LAYERS), N_EXPERT, K, seed=7).per_layer(LAYERS)


def _simulate(cost: CostModel, slots: int, policy: str, tier: int) -> HybridResult:
    """`bench repick`'s simulator column for one row: its rows, plan and warm-up."""
    full = _rows()
    plan = SlotPlan(plan_from_counts(layer_counts(full[:PROFILE_ROWS], LAYERS, N_EXPERT), slots, LAYERS))
    W, P = full[PROFILE_ROWS + 12:PROFILE_ROWS + 16], full[PROFILE_ROWS + 16:PROFILE_ROWS + 16 + N]
    core, first = masks(plan, tier, N_EXPERT)
    return simulate_hybrid(np.concatenate([W, P]), core, tier, cost, initial=first, mech=MECH[policy],
                           warmup=len(W))


def _predict(cost: CostModel, slots: int, policy: str, tier: int) -> float:
    return _simulate(cost, slots, policy, tier).ms_per_token


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


@pytest.mark.parametrize("threads", [16, 6])
def test_uploads_from_pageable_memory_add_to_the_cpus_work(threads: int) -> None:
    costs, measured = _recorded(PAGEABLE, pinned=False)
    cost = costs[threads]
    assert cost.serial_uploads and not _recorded()[0][threads].serial_uploads
    assert CostModel.h200(pinned=False).serial_uploads and not CostModel.h200().serial_uploads
    ran = dataclasses.replace(cost, serial_uploads=False)       # the split the engine made then: overlapped
    for slots in (32, 64):
        rows = {r["policy"]: r for r in measured if r["threads"] == threads and r["slots"] == slots}
        h = _simulate(ran, slots, "hybrid", rows["hybrid"]["tier"])
        # the same rows as the engine ran: its uploads now and CPU picks per token, exactly
        assert (h.sync_uploads_per_token, h.cpu_picks_per_token) == pytest.approx(
            (rows["hybrid"]["uploads"], rows["hybrid"]["cpu"]), abs=1e-3)
        # those rows cost their uploads plus their CPU part (overlapped they would have been 28 % faster at 6 threads)
        picks = 48 * K * h.hit_rate + h.sync_uploads_per_token
        summed = cost.ms_per_token(picks, h.cpu_picks_per_token, h.sync_uploads_per_token)
        assert abs(summed / rows["hybrid"]["ms"] - 1) < 0.15, (threads, slots, summed, rows["hybrid"]["ms"])
        static = _predict(cost, slots, "static", 0)
        assert abs(static / rows["static"]["ms"] - 1) < 0.15, (threads, slots, static, rows["static"]["ms"])
        if threads == 6:
            assert h.sync_uploads_per_token > 1 and h.ms_per_token < 0.9 * rows["hybrid"]["ms"]
        # with serial costs the split uploads none (a pageable upload costs 4-10x a CPU expert here): the host tier
        # is static's rows again, and no faster
        now = _simulate(cost, slots, "hybrid", rows["hybrid"]["tier"])
        assert now.sync_uploads_per_token == 0 and now.ms_per_token >= static - 1e-9
    # `auto`, as the bench asks it, keeps static; on the donor chat trace too
    rows_u = _rows()
    chat = replay.from_trace(CHAT, N_EXPERT, K).per_layer(LAYERS)
    for P in (rows_u, chat):
        for slots in (32, 64):
            d = decide_policy(Picks(P[:PROFILE_ROWS], LAYERS, N_EXPERT), slots, cost, fetch=False)
            assert d.policy == "static" and "from pageable memory: they add to the CPU part" in d.why, d.why
