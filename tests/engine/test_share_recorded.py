"""A fetch-split share's costs fitted layer by layer (profiles.sharefit, as engine.fetch_rates fits them), against
what the GPU box measured: two first-run calibrations of the 30B-A3B shape with pinned experts (an H100, 16 and 6
threads, two instances: tests/fixtures/h100-2026-12-06-first-run.toml and h100-2026-12-06-pinned.toml) and the
fetch and fetch-split rows `bench repick` measured beside them, uniform replayed routing and the donor chat trace.

Refitted from the third run's calibration's own share decodes (its raw lines), the model must predict every
fetch-split row there within 10 %, and `auto` pick within 5 % of the best measured. Fitted on the
token's sums as before, it predicted the 16-thread rows 3-14 % slow (the CPU's part charged in every layer, also
where the copies led): three rows were off by more than 10 %."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from moeslots.engine.machine import calibrate
from moeslots.engine.native import replay
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.native.tier import masks
from moeslots.profiles.costs import CostModel
from moeslots.profiles.hybrid import FETCH, simulate_hybrid
from moeslots.profiles.plan import plan_from_counts
from moeslots.profiles.policy import decide_policy
from moeslots.profiles.repick import Picks
from moeslots.profiles.sharefit import ShareFit, fit_share, predict_ms, share_steps
from moeslots.profiles.simulate import layer_counts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RUNS = {"first": FIXTURES / "h100-2026-12-06-first-run.toml", "third": FIXTURES / "h100-2026-12-06-pinned.toml",
        "fourth": FIXTURES / "h100-2026-12-07-pinned.toml"}
CHAT = Path(__file__).resolve().parents[2] / "profiles" / "data" / "moeslots-donor-qwen3-30b-a3b-chat-sampled.npz"
N_EXPERT, LAYERS, K, S = 128, list(range(48)), 8, 32       # the calibration's share: S/2 = 32 slots, every one a tier
SHARE = re.compile(r"with a CPU share, \d+ slots: ([\d.]+) ms/token, ([\d.]+) MB copied/token, (\d+) CPU misses")


def _load(run: str) -> tuple[dict[int, calibrate.Calibration], list[dict]]:
    d = tomllib.loads(RUNS[run].read_text())
    cals = {}
    for entry in d["calibration"].values():
        c = calibrate.Calibration(**{k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()})
        cals[c.threads] = c
    return cals, d["measured"]


def _refit(c: calibrate.Calibration, only: int | None = None) -> tuple[CostModel, ShareFit]:
    """The calibration's share decodes fitted per layer, as engine.fetch_rates fits them now: the first share was
    split at the CPU's own rate; the runs with its counts (the same split: as today's later shares are split where
    only the overlap was fitted) are fitted together, or the one numbered `only` alone."""
    split = dataclasses.replace(c.cost_model(pinned=True, threads=c.threads), share_cpu_gbps=0.0)
    first = np.zeros((len(LAYERS), N_EXPERT), bool)
    first[:, :S] = True
    P = replay.uniform(4096, len(LAYERS), N_EXPERT, K, seed=4).per_layer(LAYERS)[8:25]     # row 8: the warm-up
    steps = share_steps(P, S, split, initial=first, warmup=1)
    runs = [(float(ms), float(mb), int(cpu)) for ms, mb, cpu in SHARE.findall("\n".join(c.raw))]
    # the engine split that routing as the simulator does
    assert (round(steps.copies * c.slab_mb / steps.tokens, 1), steps.cpu_misses) == runs[0][1:], runs
    same = [(steps, ms) for ms, *n in runs if tuple(n) == runs[0][1:]]
    fit = fit_share(same if only is None else same[only:only + 1], S, split)
    return dataclasses.replace(split, share_overlap_ms=fit.overlap_ms, share_cpu_gbps=fit.cpu_gbps), fit


def _row(cost: CostModel, fitted: CostModel, r: dict) -> float:
    """A measured row predicted by `fitted`, split as the engine split it then (by `cost`, the costs of that run)."""
    full = (replay.uniform(1104, len(LAYERS), N_EXPERT, K, seed=7) if r.get("routing", "uniform") == "uniform"
            else replay.from_trace(CHAT, N_EXPERT, K)).per_layer(LAYERS)
    plan = SlotPlan(plan_from_counts(layer_counts(full[:1024], LAYERS, N_EXPERT), r["slots"], LAYERS))
    core, first = masks(plan, r["tier"], N_EXPERT)
    P = full[1036:1104]
    if r["policy"] == "fetch":
        return simulate_hybrid(P, core, r["tier"], fitted, initial=first, mech=FETCH, warmup=4).ms_per_token
    steps = share_steps(P, r["tier"], cost, initial=first, warmup=4, core=core)
    if "uploads" in r:                                  # the counts the engine reported for the row
        assert (steps.copies / steps.tokens, steps.cpu_misses / steps.tokens) == pytest.approx(
            (r["uploads"], r["cpu"]), abs=1e-3)
    return predict_ms(steps, r["tier"], fitted)


def _fit_holds(fit: ShareFit) -> bool:
    """The fit predicts its decodes as measured, or it did not fit (within their noise), or even a wholly hidden
    share predicts them slow (the least overlap that hides it)."""
    return (fit.within_noise or fit.predicted_ms == pytest.approx(fit.measured_ms, rel=1e-6)
            or (fit.overlap_ms > 0 and fit.predicted_ms > fit.measured_ms))


def _rows_within(run: str, threads: int, fitted: CostModel, bound: float) -> list[float]:
    cals, measured = _load(run)
    cost = cals[threads].cost_model(pinned=True, threads=threads)
    rows = [r for r in measured if r["threads"] == threads and r["policy"] in ("fetch", "fetch-split")]
    assert len(rows) >= 4
    errs = [_row(cost, fitted, r) / r["ms"] - 1 for r in rows]
    assert max(map(abs, errs)) < bound, (run, threads, rows, errs)
    return errs


@pytest.mark.parametrize("threads", [16, 6])
def test_fetch_split_rows_are_predicted_within_10_percent(threads: int) -> None:
    """The third run (today's tier patches): every fetch and fetch-split row within 10 % (the issue's bound), with
    the share fitted over the calibration's two decodes together and with each alone (a 16-token decode moves 3 %);
    and the faster of the two per cell as measured where they differ by more than 5 %."""
    cals, measured = _load("third")
    fitted, fit = _refit(cals[threads])
    assert _fit_holds(fit), fit.line()
    _rows_within("third", threads, fitted, 0.10)
    for only in (0, 1):
        alone, fit1 = _refit(cals[threads], only)
        assert _fit_holds(fit1), fit1.line()
        _rows_within("third", threads, alone, 0.10)
    cost = cals[threads].cost_model(pinned=True, threads=threads)
    rows = [r for r in measured if r["threads"] == threads and r["policy"] in ("fetch", "fetch-split")]
    for key in {(r["routing"], r["slots"]) for r in rows}:
        cell = {r["policy"]: r for r in rows if (r["routing"], r["slots"]) == key}
        if max(r["ms"] for r in cell.values()) < 1.05 * min(r["ms"] for r in cell.values()):
            continue
        got = {p: _row(cost, fitted, r) for p, r in cell.items()}
        assert min(got, key=got.get) == min(cell, key=lambda p: cell[p]["ms"]), (threads, key, got)


def test_the_whole_token_fit_was_what_missed() -> None:
    """The rows' costs as calibrated then (the share's CPU rate fitted on the token's sums) miss by more than 10 %
    at 16 threads, in both runs, all slow; refitted per layer, no row is worse off than the worst was (the first
    run, an older engine, read its share once: no bound of its own beyond that)."""
    for run in ("first", "third"):
        cals, measured = _load(run)
        cost = cals[16].cost_model(pinned=True, threads=16)
        fitted, fit = _refit(cals[16])
        assert _fit_holds(fit), fit.line()
        rows = [r for r in measured if r["threads"] == 16 and r["policy"] == "fetch-split"]
        then = [_row(cost, cost, r) / r["ms"] - 1 for r in rows]
        now = [_row(cost, fitted, r) / r["ms"] - 1 for r in rows]
        assert max(then) > 0.12 and min(then) > 0, (run, then)
        assert max(map(abs, now)) < max(then), (run, then, now)


@pytest.mark.parametrize("threads", [16, 6])
def test_the_fourth_run_as_its_calibration_stored_it(threads: int) -> None:
    """The fourth run (2026-12-07, this engine: the share fitted per layer, the host tier's route measured), with the
    costs its first-run calibration stored, no refit: every fetch and fetch-split row within 10 % (measured -9.0 to
    +6.5 %), and `auto` on the chat trace picks, in each cell, the policy measured best of the four there (it did)."""
    cals, measured = _load("fourth")
    cost = cals[threads].cost_model(pinned=True, threads=threads)
    assert cals[threads].version == 2 and cost.route_ms > 0       # this run's calibration: version 2
    _rows_within("fourth", threads, cost, 0.10)
    for r in measured:                                  # the simulator here predicts what the bench there predicted
        if r["threads"] == threads and r["policy"] in ("fetch", "fetch-split"):
            assert _row(cost, cost, r) == pytest.approx(r["predicted"], rel=2e-3), r
    full = replay.from_trace(CHAT, N_EXPERT, K).per_layer(LAYERS)
    for slots in (32, 64):
        rows = {r["policy"]: r["ms"] for r in measured
                if (r["threads"], r["routing"], r["slots"]) == (threads, "chat", slots)}
        d = decide_policy(Picks(full[:1024], LAYERS, N_EXPERT), slots, cost, fetch=True, share=True)
        assert d.policy == min(rows, key=rows.get), (slots, d.why, rows)


@pytest.mark.parametrize("threads", [16, 6])
def test_auto_picks_within_5_percent_of_the_best_from_the_first_reply(threads: int) -> None:
    """`auto` (fetch and fetch-split possible, the share measured) with the refitted costs, on the third run's chat
    trace profile: in each cell the policy it picks measured within 5 % of the best of the four measured there.
    (With the costs as calibrated then it picked fetch at 16 threads, 64 slots: 0.88 of the best, which the
    self-check had to correct. On uniform routing both costs pick as measured: left out, each cell takes ~10 s.)"""
    cals, measured = _load("third")
    fitted, _ = _refit(cals[threads])
    for routing in ("chat",):
        full = replay.from_trace(CHAT, N_EXPERT, K).per_layer(LAYERS)
        for slots in (32, 64):
            rows = {r["policy"]: r["ms"] for r in measured
                    if (r["threads"], r["routing"], r["slots"]) == (threads, routing, slots)}
            d = decide_policy(Picks(full[:1024], LAYERS, N_EXPERT), slots, fitted, fetch=True, share=True)
            assert d.policy in rows and rows[d.policy] <= 1.05 * min(rows.values()), (routing, slots, d.why, rows)
