"""Calibration: measured with the engine, stored per machine in config.toml beside the other tables, read back
into the simulator's cost model; --repick auto says which costs it used and is deterministic for a given trace
and calibration; a damaged entry is ignored, not fatal."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from moeslots.engine import bundled, calibrate
from moeslots.engine.engine import Engine, EngineConfig
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
    assert any("1 threads, 0 slots" in line for line in logs) and any("2 threads, 32 slots" in line for line in logs)
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


def test_prompt_batches_take_the_way_the_calibration_measured_faster(cfg_home: Path) -> None:
    """Prompt batches' experts that are not in slots are streamed to the GPU (op-offload) or computed on the CPU,
    whichever this machine's calibration timed faster for the memory the model is loaded in; llama.cpp's default
    (streamed) when nothing was measured, and the engine says which it took."""
    from moeslots.engine.model import LoadOptions, Model

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


def test_the_fetch_rate_is_measured_from_the_tiers_own_bytes(tiny_glm: Path, cfg_home: Path) -> None:
    """The GPU-stepped tier's rate (run with a GPU and pinned memory; here its pack in host memory, so the copies
    are memcpys): two configurations decoded, the engine's own count of the bytes copied per token logged for each
    (fewer slots: more bytes), the rate from their difference; then the second again with a CPU share that leaves
    the CPU nothing: the same bytes copied (its cost per layer from the time difference, 0 when not above the
    plain run's); a calibration carries both into the cost model."""
    from moeslots.engine.model import LoadOptions, Model

    logs: list[str] = []
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        moe = [il for il in m.facts.moe_layers if il < m.facts.n_layer]
        rate, share = calibrate._fetch_rates(m, moe, 12, 2, 24, True, logs.append)
    mb = [float(line.rsplit(", ", 1)[1].split(" MB")[0]) for line in logs]
    assert [line.split(",")[0] for line in logs] == ["GPU-stepped tier", "GPU-stepped tier",
                                                     "GPU-stepped tier with a CPU share"]
    assert len(mb) == 3 and 0 < mb[0] < mb[1] == mb[2] and rate >= 0.0 and share >= 0.0
    c = calibrate.Calibration(machine="m", date="d", model="x", slab_mb=1.0, upload_pageable_gbps=1.0,
                              upload_pinned_gbps=2.0, cpu_gbps=3.0, base_ms=1.0, method="split", fetch_gbps=41.0,
                              share_ms=0.025)
    assert c.cost_model(pinned=True).fetch_gbps == 41.0 and "41.0 GB/s read by the GPU" in c.render()
    assert c.cost_model().share_ms == 0.025 and "CPU share 25 us/layer" in c.render()
    # `auto` considers fetch-split only where the share was measured (which also ran it here)
    here = dataclasses.replace(c, machine=calibrate.machine_id())
    assert not calibrate.share_measured()                                  # no calibration
    calibrate.save(here)
    assert calibrate.share_measured()
    calibrate.save(dataclasses.replace(here, share_ms=0.0))
    assert not calibrate.share_measured()
    unmeasured = dataclasses.replace(c, fetch_gbps=0.0, share_ms=0.0).cost_model()
    assert (unmeasured.fetch_gbps, unmeasured.share_ms) == (50.0, 0.040)     # not measured: the defaults
