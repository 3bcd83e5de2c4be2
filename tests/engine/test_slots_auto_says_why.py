"""Ctrl+S `auto` (Engine.set_slots("auto")) says why it chose that many slots: without a GPU, that they live in
host memory and give no speed-up (half the experts, to show the cache at work); a number gives the load line only."""

from __future__ import annotations

from pathlib import Path

from moeslots.engine.runtime.engine import Engine, EngineConfig
from moeslots.profiles.trace import from_rows, write_csv


def test_auto_slots_say_why_without_a_gpu(tiny_glm: Path, tmp_path: Path) -> None:
    prof = tmp_path / "p.csv"
    write_csv(from_rows([(t, il, [(t + j) % 16 for j in range(4)]) for t in range(64) for il in (1, 2)],
                        {"n_expert": "16"}, k=4), prof)
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, mtp=False, profile=prof))
    try:
        line = e.set_slots("auto")
        assert "slots: 8 of 16 per layer in host memory" in line and "auto without a GPU" in line, line
        assert "no speed-up" in line
        assert "auto" not in e.set_slots(4)
    finally:
        e.close()
