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
    assert c.upload_pageable_gbps > 0 and c.cpu_gbps > 0 and c.slab_mb > 0
    assert c.method == "cpu-only lower bound" and c.upload_pinned_gbps == 0.0      # CI has no GPU
    assert any("CPU picks/token" in line for line in logs)
    calibrate.save(c)
    assert "[app]" in cfg_home.read_text() and calibrate.load() == c             # other tables kept
    cm = c.cost_model()
    assert (cm.cpu_gbps, cm.pcie_gbps, cm.slab_mb) == (c.cpu_gbps, c.upload_pageable_gbps, c.slab_mb)
    both = dataclasses.replace(c, upload_pinned_gbps=29.0)
    assert both.cost_model(pinned=True).pcie_gbps == 29.0 and both.cost_model().pcie_gbps == c.upload_pageable_gbps
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
