"""The app's default llama.cpp threads: physical cores (not hyper-threads) of the CPUs it may use, minus one for
the UI; and the app's engine gets them."""

from __future__ import annotations

from pathlib import Path

from moeslots.engine.machine.threads import app_threads, physical_cores


def _sysfs(root: Path, topo: list[tuple[int, int]]) -> Path:
    """cpuN/topology/{physical_package_id,core_id} for each (package, core) in order."""
    for cpu, (pkg, core) in enumerate(topo):
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{pkg}\n")
        (d / "core_id").write_text(f"{core}\n")
    return root


def test_hyperthreads_count_once(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, [(0, 0), (0, 1), (0, 0), (0, 1), (1, 0), (1, 1), (1, 0), (1, 1)])   # 2 x 2 cores, SMT
    assert physical_cores(list(range(8)), root) == 4 and app_threads(list(range(8)), root) == 3
    assert physical_cores([0, 2], root) == 1 and app_threads([0, 2], root) == 1   # siblings of one core
    assert app_threads([0, 1, 4], root) == 2                                         # affinity decides


def test_one_core_per_cpu_and_small_machines(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, [(0, c) for c in range(16)])
    assert app_threads(list(range(16)), root) == 15
    assert app_threads([0, 1], root) == 1          # the 2-core box: one thread, one core for the UI
    assert app_threads([0], root) == 1             # never zero


def test_unreadable_topology_counts_cpus(tmp_path: Path) -> None:
    assert physical_cores([0, 1, 2, 3], tmp_path / "nothing") == 4
    assert app_threads([0, 1, 2, 3], tmp_path / "nothing") == 3


def test_the_app_engine_takes_the_app_default(tiny_glm: Path) -> None:
    from moeslots.cli.chat import open_engine
    from moeslots.cli.launch import ChatSettings

    eng = open_engine(tiny_glm, ChatSettings(slots="0", mtp=False, ctx=256))
    try:
        assert eng.cfg.threads == app_threads()  # type: ignore[attr-defined]
    finally:
        eng.close()  # type: ignore[attr-defined]
    eng = open_engine(tiny_glm, ChatSettings(slots="0", mtp=False, threads=3, ctx=256))
    try:
        assert eng.cfg.threads == 3  # type: ignore[attr-defined]
    finally:
        eng.close()  # type: ignore[attr-defined]
