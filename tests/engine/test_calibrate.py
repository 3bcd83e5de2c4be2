"""Calibration: measured with the engine, stored per machine in config.toml beside the other tables, read back
into the simulator's cost model; --repick auto says which costs it used and is deterministic for a given trace
and calibration; a damaged entry is ignored, not fatal."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from moeslots.engine.machine import bundled, calibrate, fetch_rates
from moeslots.engine.native import replay
from moeslots.engine.runtime.engine import Engine, EngineConfig
from moeslots.profiles import sharefit
from moeslots.profiles.costs import CostModel
from moeslots.profiles.repick import choose_repick
from moeslots.profiles.trace import read_csv


@pytest.fixture()
def cfg_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path / "moeslots" / "config.toml"


def test_calibrate_save_load(cfg_home: Path) -> None:
    cfg_home.parent.mkdir(parents=True)
    cfg_home.write_text('[app]\nslots = 8\n')
    logs: list[str] = []
    c = calibrate.run(bundled.model(), threads=2, n_tokens=8, log=logs.append)
    assert c.cpu_gbps > 0 and c.slab_mb > 0 and c.threads == 2
    assert c.cpu_threads == (1, 2) and all(g > 0 for g in c.cpu_gbps_threads)     # the CPU rate by thread count
    assert c.method == "cpu-only lower bound"                                    # CI has no GPU: no PCIe to time,
    assert c.upload_pinned_gbps == c.upload_pageable_gbps == 0.0                 # said, and the H200 box's used
    assert c.upload_pinned_single_gbps == c.upload_pageable_single_gbps == 0.0 and c.host_copy_gbps > 0
    assert "PCIe uploads" in c.unmeasured and "not measured: PCIe uploads" in c.render()
    assert any("1 threads, 32 slots, miss routing" in line for line in logs)
    assert any("2 threads, 32 slots, hit routing" in line for line in logs)
    calibrate.save(c)
    assert "[app]" in cfg_home.read_text() and calibrate.load() == c             # other tables kept
    cm = c.cost_model()
    assert (cm.cpu_gbps, cm.pcie_gbps, cm.slab_mb) == (c.cpu_gbps, 5.3, c.slab_mb)
    assert c.cost_model(pinned=True).pcie_gbps == 25.6
    assert c.cost_model(threads=1).cpu_gbps == c.cpu_gbps_threads[0]
    assert "the H200 box's: not measurable here" in calibrate.costs_for(int(c.slab_mb * 1e6), pinned=False)[1]
    both = dataclasses.replace(c, upload_pinned_gbps=29.0, upload_pageable_gbps=7.0)
    assert both.cost_model(pinned=True).pcie_gbps == 29.0 and both.cost_model().pcie_gbps == 7.0
    assert calibrate.load(machine="another host / GPU") is None


def test_damaged_entry_is_ignored(cfg_home: Path) -> None:
    cfg_home.parent.mkdir(parents=True)
    cfg_home.write_text(f'[calibration."{calibrate.machine_id()}"]\ncpu_gbps = "fast"\n')
    assert calibrate.load() is None
    cfg_home.write_text("not toml [")
    assert calibrate.load() is None


def test_repick_auto_uses_the_calibration(cfg_home: Path) -> None:
    trace = read_csv(bundled.profile("merged"))
    slow_bus = calibrate.Calibration(machine=calibrate.machine_id(), date="2026-12-02", model="m", slab_mb=3.0,
                                     upload_pageable_gbps=0.5, upload_pinned_gbps=0.0, cpu_gbps=80.0,
                                     base_ms=3.0, method="split")
    fast_bus = dataclasses.replace(slow_bus, upload_pageable_gbps=2000.0, cpu_gbps=5.0, base_ms=0.0)
    a = choose_repick(trace, 16, slow_bus.cost_model())
    assert a == choose_repick(trace, 16, slow_bus.cost_model())                  # deterministic
    assert a[0] == 0                                                            # slow uploads never pay back
    assert choose_repick(trace, 16, fast_bus.cost_model())[0] > 0               # cheap uploads: re-pick
    cfg = EngineConfig(model=bundled.model(), profile=bundled.profile("merged"), slots=16, pack_host=True,
                       mtp=False, threads=2, n_ctx=256, mmap=True)          # mmap: pageable uploads
    eng = Engine(cfg)
    try:
        assert "default costs (H200 box, pageable (mmap) uploads at 5.3 GB/s)" in eng.set_repick_auto()
        calibrate.save(fast_bus)
        line = eng.set_repick_auto()
        assert "calibrated on this machine" in line and eng.cfg.repick_every > 0
    finally:
        eng.close()


def test_slots_auto_says_why(cfg_home: Path) -> None:
    cfg = EngineConfig(model=bundled.model(), profile=bundled.profile("merged"), slots="auto", pack_host=True,
                       mtp=False, threads=2, n_ctx=256)
    eng = Engine(cfg)
    try:
        line = next(n for n in eng.notices if n.startswith("slots:"))
        assert "32 of 64 per layer in host memory" in line and "% of picks served from slots" in line
        assert "default costs" in line
    finally:
        eng.close()


def test_an_entry_from_before_the_thread_and_single_copy_fields_loads(cfg_home: Path) -> None:
    """Calibrations saved before the CPU-rate-by-threads and single/batched upload fields still load (their
    defaults: none measured), and their cost model is what it was."""
    cfg_home.parent.mkdir(parents=True)
    cfg_home.write_text(f'[calibration."{calibrate.machine_id()}"]\nmachine = "m"\ndate = "2026-12-03"\nmodel = "x"\n'
                        'slab_mb = 3.0\nupload_pageable_gbps = 6.7\nupload_pinned_gbps = 26.8\ncpu_gbps = 80.0\n'
                        'base_ms = 3.0\nmethod = "split"\n')
    c = calibrate.load()
    assert c is not None and c.cpu_threads == () and c.unmeasured == ""
    assert (c.cost_model().pcie_gbps, c.cost_model(pinned=True).pcie_gbps, c.cost_model(threads=4).cpu_gbps) == \
        (6.7, 26.8, 80.0)
    # measured by an earlier version: doctor says so, and what to do
    assert c.version == 0 and "measured by an earlier version" in c.render()
    assert "run `moeslots doctor --calibrate` again" in c.render()
    assert "earlier version" not in dataclasses.replace(c, version=calibrate.VERSION).render()
    # a key a later version wrote (unknown here) is left out, not the whole entry
    cfg_home.write_text(cfg_home.read_text() + "a_later_field = 1.5\n")
    assert calibrate.load() == c


def test_prompt_batches_take_the_way_the_calibration_measured_faster(cfg_home: Path) -> None:
    """Prompt batches' experts that are not in slots are streamed to the GPU (op-offload) or computed on the CPU,
    whichever this machine's calibration timed faster for the memory the model is loaded in; llama.cpp's default
    (streamed) when nothing was measured, and the engine says which it took."""
    from moeslots.engine.llm.model import LoadOptions, Model

    with Model(bundled.model(), LoadOptions(experts_on_host=True, extra_bufts=False)) as m:
        logs: list[str] = []
        moe = [il for il in m.facts.moe_layers if il < m.facts.n_layer]
        g, c = calibrate._prompt_rates(m, moe, 16, 2, logs.append, n_tokens=64, pack_host=True)
        assert g > 0 and c > 0 and len(logs) == 2 and "at 16 slots" in logs[1]
    base = calibrate.Calibration(machine=calibrate.machine_id(), date="2026-12-03", model="m", slab_mb=3.0,
                                 upload_pageable_gbps=7.0, upload_pinned_gbps=50.0, cpu_gbps=80.0, base_ms=3.0,
                                 method="split")
    assert base.prompt_offload(pinned=False) is None and calibrate.prompt_path(pinned=False) == (True, "")
    cal = dataclasses.replace(base, prompt_stream_tok_s=240.0, prompt_cpu_tok_s=410.0,   # mmap: the CPU wins
                              prompt_stream_pinned_tok_s=1900.0, prompt_cpu_pinned_tok_s=410.0)
    calibrate.save(cal)
    assert calibrate.load() == cal and "prompt 512 streamed/CPU: 240/410 tok/s pageable" in cal.render()
    assert calibrate.prompt_path(pinned=False)[0] is False and calibrate.prompt_path(pinned=True)[0] is True
    cfg = EngineConfig(model=bundled.model(), pack_host=True, mtp=False, threads=2, n_ctx=256, mmap=True)
    for mmap, offload, how in ((True, False, "computed on the CPU"), (False, True, "streamed to the GPU")):
        eng = Engine(dataclasses.replace(cfg, mmap=mmap))
        try:
            assert eng.ctx.op_offload is offload
            assert any(n.startswith(f"prompts: experts not in slots {how}") for n in eng.notices), eng.notices
        finally:
            eng.close()


def test_the_fetch_costs_are_measured_from_the_tiers_own_counts(tiny_glm: Path) -> None:
    """The GPU-stepped tier's costs (run with a GPU and pinned memory; here its pack in host memory, so the copies
    are memcpys): plain decodes at S and S/2 (fewer slots: more bytes copied, as the engine counts them), then S/2
    plain and with a CPU share that leaves the CPU nothing, taking turns (the same bytes copied, no CPU miss), then
    shares at this machine's costs, which must give the CPU misses (and copy less), each fitted per layer: the
    simulator split the same routing as the engine did (else a line says the split is not the simulator's)."""
    from moeslots.engine.llm.model import LoadOptions, Model

    logs: list[str] = []
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        moe = [il for il in m.facts.moe_layers if il < m.facts.n_layer]
        fc = fetch_rates.fetch_rates(m, moe, 12, 2, 24, True, logs.append, CostModel(slab_mb=0.1, cpu_gbps=1e6))
    fitted = "fetch-split share fitted per layer: "
    runs = [line for line in logs if not line.startswith(fitted)]
    mb = [float(line.split(", ")[2].split(" MB")[0]) for line in runs]
    shared = "GPU-stepped tier with a CPU share"
    assert [line.split(",")[0] for line in runs[:8]] == (["GPU-stepped tier"] * 2 + [shared, "GPU-stepped tier"]
                                                         + [shared] * 2 + ["GPU-stepped tier", shared]), logs
    assert 8 <= len(runs) <= 7 + fetch_rates.SHARE_FITS and all(line.startswith(shared) for line in runs[8:]), logs
    assert 0 < mb[0] < mb[1] and mb[1:7] == [mb[1]] * 6, logs                   # dear shares copy every miss
    assert "CPU misses" in runs[7] and mb[7] < mb[1], logs                      # a cheap CPU takes misses
    assert not any("CPU misses" in line for line in runs[:7])
    after = logs[7:] + [""]                     # each share that computed is fitted just after it, unless the two
    fits = [after[i + 1].startswith(fitted) for i, line in enumerate(after) if "CPU misses" in line]  # plain runs
    assert all(fits) if fc.gbps > 0 else not any(fits), logs                    # gave no line (a busy machine)
    assert fc.share_ms > 0 and fc.gbps >= 0.0 and fc.base_ms >= 0.0 and fc.share_cpu_gbps >= 0.0
    assert fc.gbps == 0 or fc.share_overlap_ms > 0 or fc.share_cpu_gbps > 0 or "no overlap" in logs[-1], logs
    assert fc.raw == tuple(logs)


def test_a_share_that_never_computes_is_not_measured(tiny_glm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the shares at this machine's costs give the CPU nothing (the share not running), its cost is 0 (not
    measured) and one line says why, however the times came out."""
    from moeslots.engine.llm.model import LoadOptions, Model

    real = fetch_rates._tier_run

    def no_cpu(*a: object, **k: object) -> fetch_rates.TierRun | None:
        r = real(*a, **k)                       # type: ignore[arg-type]
        return None if r is None else fetch_rates.TierRun(r.ms + (1.0 if a[4] else 0.0), r.mb, 0)

    monkeypatch.setattr(fetch_rates, "_tier_run", no_cpu)
    logs: list[str] = []
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        moe = [il for il in m.facts.moe_layers if il < m.facts.n_layer]
        fc = fetch_rates.fetch_rates(m, moe, 12, 2, 12, True, logs.append)
    assert fc.share_ms == 0.0 and fc.share_cpu_gbps == 0.0 and logs[-1].startswith("the CPU share did not run"), logs


class _FakeModel:
    class facts:  # stands in for Model.facts
        n_expert_used, n_expert, slab_bytes = 4, 48, 2_000_000

    n_vocab = 1000

    def set_slots(self, *a: object, **k: object) -> None: ...


class _FakeCtx:
    ptr = None

    def __init__(self, *a: object, **k: object) -> None: ...
    def __enter__(self) -> "_FakeCtx": return self
    def __exit__(self, *a: object) -> None: ...


def _known_machine(monkeypatch: pytest.MonkeyPatch, truth: dict[str, float], count: Callable[[int], int] = int,
                   ) -> tuple[list[CostModel], list[str]]:
    """fetch_rates on a machine whose times are known: plain runs and dear shares as listed below, and shares at
    the machine's costs split as the simulator splits the calibration's routing, timed by the cost model with the
    `truth` (share_overlap_ms / share_cpu_gbps) the fit must find; count: what the machine reports of its CPU
    misses (int: the simulator's)."""
    fixed = iter([(10.5, 100.0, 0), (20.5, 200.0, 0),      # S, S/2 plain: 10 GB/s, 0.5 ms fixed
                  (20.6, 200.0, 0),                         # round 0: dear share (its plain run is the S/2 run)
                  (20.5, 200.0, 0), (20.7, 200.0, 0),       # round 1: plain, dear share
                  (67.0, 200.0, 0), (20.5, 200.0, 0)])      # round 2: dear share (an outlier), plain
    costs: list[CostModel] = []
    f = _FakeModel.facts
    P = replay.uniform(4096, 2, f.n_expert, f.n_expert_used, seed=4).per_layer([0, 1])[8:17]
    first = np.zeros((2, f.n_expert), bool)
    first[:, :12] = True

    def fake(m, ctx, moe, s, share, cost, toks, pack_host, log):  # type: ignore[no-untyped-def]
        costs.append(cost)
        if len(costs) <= 7:
            return fetch_rates.TierRun(*next(fixed))
        steps = sharefit.share_steps(P, s, cost, initial=first, warmup=1)
        ms = sharefit.predict_ms(steps, s, dataclasses.replace(cost, **truth))
        return fetch_rates.TierRun(ms, steps.copies * f.slab_bytes / 1e6 / steps.tokens, count(steps.cpu_misses))

    logs: list[str] = []
    monkeypatch.setattr(fetch_rates, "_tier_run", fake)
    monkeypatch.setattr(fetch_rates, "Context", _FakeCtx)
    monkeypatch.setattr(fetch_rates.replay, "set_replay", lambda *a: None)
    fc = fetch_rates.fetch_rates(_FakeModel(), [0, 1], 24, 2, 8, True, logs.append,  # type: ignore[arg-type]
                                 CostModel(slab_mb=2.0, cpu_gbps=30.0))
    assert fc.gbps == pytest.approx(10.0) and fc.base_ms == pytest.approx(0.5)
    assert fc.share_ms == pytest.approx(0.2 / 2)               # median of 0.1, 0.2, 46.5 ms over 2 layers
    assert costs[-1].fetch_base_ms == pytest.approx(0.5) and costs[-1].fetch_gbps == pytest.approx(10.0)
    assert costs[7].share_cpu_gbps == costs[7].share_overlap_ms == 0.0      # the first share: the CPU's own rate
    return costs, logs


def test_the_share_fit_finds_the_gpus_work_beside_the_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """A share that hides partly behind 100 us of the GPU's own work a layer: the fit finds 100 us and the CPU at its
    own rate; every share is split as the first (the overlap does not move the split)."""
    costs, logs = _known_machine(monkeypatch, {"share_overlap_ms": 0.1})
    fits = [line for line in logs if line.startswith("fetch-split share fitted per layer")]
    assert len(fits) == fetch_rates.SHARE_FITS and "the GPU's work beside the share 100.0 us/layer" in fits[-1], logs
    assert costs[-1].share_overlap_ms == pytest.approx(0.1) and costs[-1].share_cpu_gbps == 0.0


def test_a_share_within_the_noise_is_not_fitted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A share whose decodes come within 2 % of the unfitted prediction (here 20 us of overlap, 1 %): nothing is
    fitted (one 16-token decode moves about that much), and the line says so."""
    costs, logs = _known_machine(monkeypatch, {"share_overlap_ms": 0.02})
    assert costs[-1].share_overlap_ms == costs[-1].share_cpu_gbps == 0.0
    assert "the CPU at its own rate, no overlap (within the decodes' noise)" in logs[-1], logs


def test_the_share_fit_finds_a_slow_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """A share whose CPU runs at 12 GB/s where it streams at 30: the fit finds 12 and no overlap, and the second
    share is split by that rate."""
    costs, logs = _known_machine(monkeypatch, {"share_cpu_gbps": 12.0})
    assert costs[-1].share_cpu_gbps == pytest.approx(12.0, rel=1e-6) and costs[-1].share_overlap_ms == 0.0
    assert "the share's CPU at 12.0 GB/s" in logs[-1], logs


def test_a_share_the_simulator_does_not_reproduce_is_not_fitted(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the engine's counts are not the simulator's split of the same routing, the share's costs are not fitted
    (the CPU at its own rate, no overlap) and one line says why."""
    costs, logs = _known_machine(monkeypatch, {"share_overlap_ms": 0.1}, count=lambda n: n + 1)
    assert logs[-1].startswith("the CPU share's split is not the simulator's"), logs
    assert len(costs) == 8                                      # no second share


def test_the_fetch_costs_reach_the_cost_model(cfg_home: Path) -> None:
    c = calibrate.Calibration(machine="m", date="d", model="x", slab_mb=1.0, upload_pageable_gbps=1.0,
                              upload_pinned_gbps=2.0, cpu_gbps=3.0, base_ms=1.0, method="split", fetch_gbps=41.0,
                              share_ms=0.025, fetch_base_ms=6.5, share_cpu_gbps=20.0)
    cm = c.cost_model(pinned=True)
    assert (cm.fetch_gbps, cm.share_ms, cm.fetch_base_ms, cm.share_cpu_gbps) == (41.0, 0.025, 6.5, 20.0)
    assert "41.0 GB/s read by the GPU" in c.render()
    assert "CPU share 25 us/layer (--policy fetch-split), its CPU at 20.0 GB/s" in c.render()
    # `auto` considers fetch-split only where the share was measured (which also ran it here)
    here = dataclasses.replace(c, machine=calibrate.machine_id())
    assert not calibrate.share_measured()                                  # no calibration
    calibrate.save(here)
    assert calibrate.share_measured()
    calibrate.save(dataclasses.replace(here, share_ms=0.0))
    assert not calibrate.share_measured()
    unmeasured = dataclasses.replace(c, fetch_gbps=0.0, share_ms=0.0, fetch_base_ms=0.0).cost_model()
    assert (unmeasured.fetch_gbps, unmeasured.share_ms, unmeasured.fetch_base_ms) == (50.0, 0.040, 0.0)


def test_cpu_rate_and_base_between_measured_thread_counts() -> None:
    """A thread count the calibration did not measure takes the rate between its neighbours', not the top one's."""
    c = calibrate.Calibration(machine="m", date="d", model="x", slab_mb=1.0, upload_pageable_gbps=1.0,
                              upload_pinned_gbps=2.0, cpu_gbps=104.2, base_ms=12.0, method="split", threads=16,
                              cpu_threads=(1, 2, 4, 8, 16), cpu_gbps_threads=(5.0, 10.5, 20.3, 45.2, 104.2),
                              base_ms_threads=(14.0, 13.0, 13.0, 12.5, 12.0))
    assert c.cost_model(threads=6).cpu_gbps == pytest.approx((20.3 + 45.2) / 2)
    assert c.cost_model(threads=6).base_ms == pytest.approx(12.75)
    assert c.cost_model(threads=16).cpu_gbps == 104.2 and c.cost_model(threads=32).cpu_gbps == 104.2
    assert c.cost_model().cpu_gbps == 104.2 and c.cost_model().base_ms == 12.0


def test_the_cpu_rate_takes_the_median_of_its_pairs() -> None:
    """Readings (ms/token, CPU picks/token) with routing that misses the slots and routing that hits them, taking
    turns: one fast reading (the CPU's throughput drifts over seconds) moves a rate taken from the last pair by 3x;
    the median of the pairs keeps the rate the others agree on."""
    from moeslots.engine.machine.cpu_rate import Reading, rate_from_readings

    slab = 2.0                                              # MB per expert
    miss = [Reading(30.0, 200.0), Reading(30.5, 200.0), Reading(24.0, 200.0)]   # the last one ran fast
    hit = [Reading(10.0, 0.0), Reading(10.5, 0.0), Reading(10.5, 0.0)]
    gbps, base, how = rate_from_readings(miss, hit, slab, pack_host=False)
    assert how == "split" and gbps == pytest.approx(200 * slab / 20.0)          # 20 GB/s, not 400 / 13.5 = 30
    assert base == pytest.approx(30.0 - 200 * slab / gbps)
    gbps, base, how = rate_from_readings([Reading(30.0, 200.0)], [Reading(29.5, 100.0)], slab, pack_host=False)
    assert how.startswith("lower bound") and gbps == pytest.approx(200 * slab / 30.0) and base == 0.0
    gbps, base, how = rate_from_readings(miss, hit, slab, pack_host=True)
    assert how == "cpu-only lower bound" and base == 0.0
    with pytest.raises(ValueError):
        rate_from_readings([], hit, slab, pack_host=False)


def test_the_cpu_rate_reads_the_cpus_own_compute_when_the_clock_has_it() -> None:
    """The walls also hold the host's wait for the GPU, which drifts with the GPU (here by 4 ms between the two
    routings of each pair); the scheduler's clock of the CPU splits' compute does not: the rate comes from it."""
    from moeslots.engine.machine.cpu_rate import Reading, rate_from_readings

    slab = 2.0
    miss = [Reading(30.0, 200.0, 16.0), Reading(31.0, 200.0, 16.2), Reading(29.0, 200.0, 15.8)]
    hit = [Reading(14.0, 0.0, 6.0), Reading(15.0, 0.0, 6.2), Reading(13.0, 0.0, 5.8)]   # walls 16 apart, CPU 10
    gbps, base, how = rate_from_readings(miss, hit, slab, pack_host=False)
    assert how == "split, scheduler clock" and gbps == pytest.approx(200 * slab / 10.0)
    assert base == pytest.approx(30.0 - 200 * slab / gbps)
    walls = [Reading(r.ms, r.picks) for r in hit]           # one reading without the clock: the walls
    gbps, _, how = rate_from_readings(miss, walls, slab, pack_host=False)
    assert how == "split" and gbps == pytest.approx(200 * slab / 16.0)


def test_pairs_that_disagree_are_read_again() -> None:
    """Three pairs read right after a 16 GB pinned load on the H100 box (16 threads, 64 of 128 slots, 191.5 CPU picks
    a token): the CPU slowed through them, their rates 99, 60 and 46 GB/s. They disagree, so two pairs more are read;
    with two steady ones after, the median of the five is the machine's rate, not the slowed one the three gave."""
    from moeslots.engine.machine.cpu_rate import Reading, disagree, pair_rates, rate_from_readings

    slab = 2.654208
    miss = [Reading(13.15, 191.5, 6.64), Reading(15.37, 191.5, 10.85), Reading(24.93, 191.5, 15.63)]
    hit = [Reading(8.17, 0.0, 1.49), Reading(8.97, 0.0, 2.39), Reading(8.13, 0.0, 4.63)]
    rates = pair_rates(miss, hit, slab)
    assert [round(r) for r in rates] == [99, 60, 46] and disagree(rates)
    three, _, _ = rate_from_readings(miss, hit, slab, pack_host=False)
    assert three == pytest.approx(rates[1])
    miss += [Reading(12.60, 191.5, 6.10), Reading(12.70, 191.5, 6.20)]
    hit += [Reading(8.10, 0.0, 1.45), Reading(8.15, 0.0, 1.47)]
    five, base, how = rate_from_readings(miss, hit, slab, pack_host=False)
    assert five == pytest.approx(191.5 * slab / (6.64 - 1.49)) and five > 1.5 * three and how.endswith("clock")
    assert not disagree([80.4, 89.8, 84.7]) and disagree([80.0, 0.0]) and not disagree([80.0])
