"""scripts/sidebyside/ (llama.cpp b11549 beside moeslots), its pure-Python parts: the replay table file that
llama.cpp's routing-replay hook reads (layout, round trip, errors), the rows and layers it takes from the routing
`moeslots bench repick` replays, and table.py's collection and rendering. No build, no engine, no network."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from moeslots.engine.machine import bundled
from moeslots.engine.native import replay

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE.parent / "scripts" / "sidebyside"


def _module(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)               # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _module("replay_table", monkeypatch)


@pytest.fixture
def tb(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return _module("table", monkeypatch)


def test_table_file_layout_and_round_trip(rt: ModuleType, tmp_path: Path) -> None:
    ids = np.random.default_rng(1).integers(0, 64, (5, 3, 4)).astype(np.int64)
    path = tmp_path / "t.mrp1"
    rt.write_table(path, ids)
    raw = path.read_bytes()
    assert raw[:16] == b"MRP1" + struct.pack("<iii", 5, 3, 4)             # magic, rows, layers, k
    assert len(raw) == 16 + 4 * 5 * 3 * 4
    r, layer, j = 3, 2, 1                                                  # row-major [row][layer][k], int32 LE
    assert struct.unpack_from("<i", raw, 16 + 4 * ((r * 3 + layer) * 4 + j))[0] == ids[r, layer, j]
    back = rt.read_table(path)
    assert back.dtype == np.int32 and np.array_equal(back, ids)


@pytest.mark.parametrize("data, why", [
    (b"MRP2" + struct.pack("<iii", 1, 1, 1) + b"\0" * 4, "not a routing table"),
    (b"MRP1" + struct.pack("<iii", 2, 1, 1) + b"\0" * 4, "the header says"),
    (b"MRP1" + struct.pack("<iii", 1, 1, 1) + struct.pack("<i", -3), "negative"),
    (b"MRP1", "too short"),
])
def test_read_table_refuses_bad_files(rt: ModuleType, tmp_path: Path, data: bytes, why: str) -> None:
    path = tmp_path / "bad.mrp1"
    path.write_bytes(data)
    with pytest.raises(rt.TableError, match=why):
        rt.read_table(path)


def test_write_table_refuses_bad_ids(rt: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(rt.TableError, match="rows, layers, k"):
        rt.write_table(tmp_path / "a", np.zeros((4, 4), np.int32))
    with pytest.raises(rt.TableError, match="integers"):
        rt.write_table(tmp_path / "b", -np.ones((1, 1, 1), np.int32))
    assert not list(tmp_path.iterdir())


def test_table_rows_are_the_rows_bench_repick_times(rt: ModuleType) -> None:
    """llama.cpp's position p in model layer il replays what moeslots' timed decode token p routes there:
    bench repick times rows profile_rows + 16 + p of the per-model-layer picks (engine.replay.per_layer)."""
    profile_rows, n_decode, moe, n_block = 1024, 64, [1, 2, 3, 4, 5, 6], 8     # glm4moe: block 0 dense, 7 NextN
    full = replay.uniform(profile_rows + n_decode + 16, len(moe), 64, 4, seed=rt.UNIFORM_SEED)
    table = rt.table_for(full.ids, n_block, skip=profile_rows + rt.WARM_ROWS, rows=n_decode)
    assert table.shape == (n_decode, n_block, 4)
    timed = full.per_layer(moe)[profile_rows + 16:profile_rows + 16 + n_decode]
    for j, il in enumerate(moe):
        assert np.array_equal(table[:, il % table.shape[1]], timed[:, j])


def test_table_for_refuses_a_short_routing(rt: ModuleType) -> None:
    with pytest.raises(rt.TableError, match="fewer than"):
        rt.table_for(np.zeros((10, 2, 4), np.int32), 2, skip=10, rows=4)


def test_model_facts_and_cache_mib(rt: ModuleType) -> None:
    f = rt.model_facts(bundled.model())
    assert (f.arch, f.n_block, f.n_layer, f.moe_layers, f.n_expert, f.k) == ("glm4moe", 8, 7, 6, 64, 4)
    assert f.cache_mib(16) == -(-16 * f.slab_bytes * 6 // 2**20)            # rounded up: llama.cpp gets >= ours
    assert f.cache_mib(16) * 2**20 >= 16 * f.slab_bytes * 6


def test_render_fixture(tb: ModuleType) -> None:
    d = json.loads((HERE / "fixtures" / "sidebyside.json").read_text())
    md = tb.render(d)
    assert "Hardware: 16 CPU threads (Test Xeon); GPU: NVIDIA H200" in md
    assert "qwen3moe, 48 layers" in md
    lines = [x for x in md.splitlines() if x.startswith("| pinned | 16 |")]
    row = {x.split(" | ")[2] + " " + x.split(" | ")[3]: x for x in lines}
    assert "55.5 (0.96×, 50 %)" in row["random 64 (7775)"]                  # 55.5 / 57.6 beside its cache
    assert "43.2 (0.99×, 25 %)" in row["random 32 (3888)"]
    assert "75.0 (1.50×, 60 %)" in row["chat 64 (7775)"]                     # a trace: its own rows
    assert "| 39.4 | 1363 | 57.6 | 1600 |" in row["random 64 (7775)"]
    assert "moeslots bench repick big.gguf" in md and "pinned, 16 threads, 64 slots, uniform: auto chose static" in md
    assert "†" not in md


def test_what_a_new_user_gets_after_the_self_check(tb: ModuleType) -> None:
    """The defaults' lines: the default's first choice against the best named policy and llama.cpp's cache, and the
    default after auto's self-check where the bench measured it (not counted as "the best")."""
    cell = {"load": "pinned", "threads": 16, "routing": "uniform", "slots": 32}
    ours = [dict(cell, policy="default", tok_s=65.3, chosen="fetch: 16 core + 16 tier slots"),
            dict(cell, policy="default, settled", tok_s=71.3),
            dict(cell, policy="fetch-split", tok_s=70.8), dict(cell, policy="static", tok_s=65.9)]
    lines = tb._defaults(ours, lambda load, t, routing, mib, test: 43.5 if mib == 3888 else 60.0, {32: 3888})
    assert lines[2] == ("- pinned, 16 threads, 32 slots, uniform: default 65.3 tok/s = 0.92 of the best (fetch-split "
                        "70.8), 1.50x llama.cpp's cache; after its self-check 71.3 tok/s = 1.01 of the best"), lines
    # static read once before the turns is the same policy at another moment: said, not "the best"
    ours.append(dict(cell, policy="static (--every 0)", tok_s=73.0))
    lines = tb._defaults(ours, lambda load, t, routing, mib, test: 43.5 if mib == 3888 else 60.0, {32: 3888})
    assert lines[2].startswith("- pinned, 16 threads, 32 slots, uniform: default 65.3 tok/s = 0.92 of the best "
                               "(fetch-split 70.8; static measured once before the turns 73.0, the default 0.89 of "
                               "it), 1.50x llama.cpp's cache"), lines
    assert lines[-1] == "- the default chose the best row's policy in 0 of 1 cells; its speed was within 5 % of the " \
                        "best in 0 of 1", lines


def test_a_default_that_ran_the_best_policy_is_said_so(tb: ModuleType) -> None:
    """A default that chose the best row's own policy: the gap is between two readings of it, and the line says so;
    the count at the end tells picks from speeds."""
    cells = [{"load": "pinned", "threads": 6, "routing": "uniform", "slots": s} for s in (32, 64)]
    ours = [dict(cells[0], policy="default", tok_s=64.0, chosen="fetch-split: 0 core + 64 tier slots, 50 % hits"),
            dict(cells[0], policy="fetch-split", tok_s=67.4), dict(cells[0], policy="fetch", tok_s=60.8),
            dict(cells[1], policy="default", tok_s=28.0, chosen="static (the default without a GPU)"),
            dict(cells[1], policy="static", tok_s=28.4), dict(cells[1], policy="hybrid", tok_s=27.5)]
    lines = tb._defaults(ours, lambda *a: 0.0, {32: 3888, 64: 7776})
    assert "0.95 of the best (fetch-split 67.4, the policy the default ran)" in lines[2], lines
    assert "0.99 of the best (static 28.4, the policy the default ran)" in lines[3], lines
    assert lines[-1] == "- the default chose the best row's policy in 2 of 2 cells; its speed was within 5 % of the " \
                        "best in 1 of 2", lines


def test_collect_from_results_without_a_cache(tb: ModuleType, tmp_path: Path) -> None:
    """A CPU-only llama-bench (no cache sizes): moeslots' ratio is against llama.cpp without a cache, marked †."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (tmp_path / "facts.json").write_text(json.dumps({"path": "m.gguf", "shape": "tiny", "cache_mib": {"16": 4}}))
    bench = [{"n_prompt": 512, "n_gen": 0, "moe_cache_mib": 0, "avg_ts": 6000.0, "stddev_ts": 1.0,
              "build_commit": "b11549", "build_number": 11549, "backends": "CPU"},
             {"n_prompt": 0, "n_gen": 64, "moe_cache_mib": 0, "avg_ts": 1800.0, "stddev_ts": 1.0}]
    (raw / "l.json").write_text(json.dumps(bench))
    ours = {"policies": [{"routing": "uniform", "slots": 16, "policy": "static", "decode_tok_s": 900.0,
                          "hit_rate": 0.25, "chosen": ""}],
            "rows": [{"routing": "uniform", "slots": 16, "every": 0, "decode_tok_s": 1000.0, "hit_rate": 0.25}]}
    (raw / "m.json").write_text(json.dumps(ours))
    runs = [{"engine": "llama.cpp", "load": "mmap", "threads": "2", "routing": "random", "json": str(raw / "l.json"),
             "cmd": "llama-bench ..."},
            {"engine": "moeslots", "load": "mmap", "threads": "2", "routing": "", "json": str(raw / "m.json"),
             "cmd": "moeslots bench repick ..."}]
    (tmp_path / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    assert tb.main([str(tmp_path)]) == 0
    md = (tmp_path / "sidebyside.md").read_text()
    assert json.loads((tmp_path / "sidebyside.json").read_text())["llama"][1]["test"] == "tg64"
    assert "| mmap | 2 | random | 16 (4) | 1800 | 6000 | – | – | 900 (0.50×†, 25 %) | 1000 (0.56×†, 25 %) |" in md
    assert "†: the ratio to llama.cpp without a cache" in md


def test_runs_that_did_not_finish_are_left_out_and_listed(tb: ModuleType, tmp_path: Path) -> None:
    """A run cut off (its result file empty or half written) or never started: the table is made from the others and
    lists those as not run, instead of stopping on the bad file."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (tmp_path / "facts.json").write_text(json.dumps({"path": "m.gguf", "shape": "tiny", "cache_mib": {"16": 4}}))
    (raw / "l.json").write_text(json.dumps([{"n_prompt": 0, "n_gen": 64, "moe_cache_mib": 0, "avg_ts": 1800.0,
                                             "stddev_ts": 1.0}]))
    (raw / "cut.json").write_text('[{"n_prompt": 0, "n_ge')
    (raw / "empty.json").write_text("")
    runs = [{"engine": "llama.cpp", "load": "mmap", "threads": t, "routing": "random", "json": str(raw / f),
             "cmd": f"llama-bench -t {t}"} for t, f in (("2", "l.json"), ("4", "cut.json"), ("6", "empty.json"),
                                                         ("8", "never.json"))]
    (tmp_path / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    assert tb.main([str(tmp_path)]) == 0
    d = json.loads((tmp_path / "sidebyside.json").read_text())
    assert [r["threads"] for r in d["llama"]] == [2]
    assert d["not_run"] == [f"llama.cpp: llama-bench -t {t}" for t in (4, 6, 8)]
    md = (tmp_path / "sidebyside.md").read_text()
    assert "Not run (stopped before them, or failed):" in md and "llama-bench -t 8" in md.split("Not run")[1]


def test_collect_says_what_is_missing(tb: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tb.main([str(tmp_path)]) == 2
    assert "run run.sh first" in capsys.readouterr().err


def test_run_sh_asks_for_fetch_only_where_experts_are_pinned(tiny_glm: Path, tmp_path: Path) -> None:
    """With a GPU, `--policy fetch` and `fetch-split` need pinned experts: run.sh passes them in the pinned cells and
    drops them from the mmap cells (whose table shows "–" there), instead of a moeslots run that refuses the whole
    row."""
    import os
    import subprocess

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    (bindir / "llama-bench").write_text("#!/bin/sh\necho '{}'\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(SCRIPTS / "run.sh"), str(tiny_glm), str(bindir / "llama-bench"), "--out",
                        str(tmp_path / "out"), "--policies", "static,fetch,fetch-split,auto", "--threads", "2",
                        "--dry-run"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    ours = [ln for ln in (p.stdout + p.stderr).splitlines() if "bench repick" in ln]
    pinned = [ln for ln in ours if "--no-mmap" in ln]
    mapped = [ln for ln in ours if "--no-mmap" not in ln]
    assert pinned and mapped
    assert all("--policy static,fetch,fetch-split,auto" in ln for ln in pinned)
    assert all("--policy static,auto" in ln for ln in mapped)


def test_a_row_off_by_more_than_10_percent_shows_its_readings(tb: ModuleType) -> None:
    """Predicted against measured: a row off by more than 10 % is flagged and lists each reading (bench repick
    --json's rep_ms), so that a row that moved between readings shows as such; rows within 10 % stay short."""
    cell = {"load": "pinned", "threads": 6, "routing": "uniform", "slots": 64}
    ours = [dict(cell, policy="static", ms=25.79, sim_ms=28.44, rep_ms=[25.42, 26.16]),
            dict(cell, policy="fetch", ms=16.46, sim_ms=16.63, rep_ms=[16.22, 16.70]),
            dict(cell, policy="hybrid", ms=14.18, sim_ms=16.68)]                 # no readings kept (older runs)
    lines = tb._predicted(ours)
    assert lines[1] == "Predicted vs measured ms/token: 1 of 3 rows within 10 %."
    assert lines[-3].endswith("| 25.79 | 28.44 | +10.3 % ! (readings 25.42, 26.16) |"), lines
    assert lines[-2].endswith("| 16.46 | 16.63 | +1.0 % |"), lines
    assert lines[-1].endswith("| 14.18 | 16.68 | +17.6 % ! |"), lines
