"""`--policy auto` by itself: the first-run calibration (engine.autocal) measured end to end on the CPU engine, kept
per machine and model shape, not measured again; the check of its choice (engine.autocheck) against the measured
decode speed, with a fake clock that makes the chosen policy slow: the runner-up is tried between replies and the
faster of the two stays."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from moeslots.engine.bench.tier import SETTLED, TierRow, _settle
from moeslots.engine.machine import autocal, calibrate
from moeslots.engine.runtime import autocheck
from moeslots.engine.runtime.autocheck import AutoCheck
from moeslots.engine.runtime.engine import Engine, EngineConfig, Message, TextDelta
from moeslots.profiles.policy import Decision, Scored
from moeslots.profiles.trace import from_rows, write_csv


@pytest.fixture()
def cfg_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path / "moeslots" / "config.toml"


def _profile(path: Path, layers: tuple[int, ...] = (1, 2), n_expert: int = 16, k: int = 4, tokens: int = 400) -> Path:
    rng = np.random.default_rng(5)
    rows = [(t, il, rng.choice(n_expert, k, replace=False).tolist()) for t in range(tokens) for il in layers]
    write_csv(from_rows(rows, {"n_expert": str(n_expert)}, k=k), path)
    return path


def _reply(e: Engine, ask: str) -> int:
    e.new_chat()
    return sum(1 for ev in e.chat([Message("user", ask)]) if isinstance(ev, TextDelta))


def test_first_run_calibration_on_the_cpu_engine(tiny_glm: Path, tmp_path: Path, cfg_home: Path) -> None:
    """With no calibration for this model shape, `auto` measures what a CPU can (the CPU's rate and uploads, as
    host copies) before its first plan, says each step and what it skipped, stores it under the machine, shape,
    thread count and memory, and decides with it; the next engine on the same shape finds it and measures nothing.
    Without a GPU and without asking, nothing is measured (auto is the default only where a GPU holds slots)."""
    prof = _profile(tmp_path / "p.csv")
    said: list[str] = []
    cfg = EngineConfig(model=tiny_glm, threads=2, pack_host=True, mtp=False, slots=6, profile=prof, policy="auto",
                       calibrate="always", mmap=True)
    e = Engine(cfg, progress=said.append)
    try:
        snap = e.snapshot()
        notices = list(e.notices)
    finally:
        e.close()
    assert said[0].startswith("calibrating for --policy auto") and any(s.startswith("1/3 ") for s in said), said
    assert any(s.startswith("2/3 uploads") for s in said) and said[-1].startswith("calibrated in"), said
    assert any(s.startswith("3/3 the host tier's route") for s in said), said
    assert any("not measured: uploads over PCIe and the GPU-stepped tier" in n for n in notices), notices
    assert snap.progress == "" and snap.policy_line.startswith("auto: ") and "first-run calibration" in \
        snap.policy_line, snap.policy_line
    table = tomllib.loads(cfg_home.read_text())["calibration"]
    (key, entry), = table.items()
    assert " | 2 threads | pageable" in key and "x 16 experts (4 used)" in key
    assert entry["kind"] == "first-run" and entry["cpu_gbps"] > 0 and len(entry["raw"]) >= 3
    assert entry["version"] == calibrate.VERSION and entry["route_ms"] > 0, entry   # the host tier's route, measured
    assert any(r.startswith("the host tier's route: ") for r in entry["raw"]), entry["raw"]
    line = r"2 threads, 6 slots, {} routing: [\d.]+ ms/token, ([\d.]+) CPU picks/token, CPU compute [\d.]+ ms"
    picks = {w: [float(x) for x in re.findall(line.format(w), "\n".join(entry["raw"]))]
             for w in ("miss", "hit")}
    assert len(picks["miss"]) == len(picks["hit"]) == 3, entry["raw"]      # three pairs, the clock read in each
    assert all(p > 0 for p in picks["miss"]) and picks["hit"] == [0.0] * 3, picks   # "hit" leaves nothing to the CPU
    said.clear()
    e = Engine(cfg, progress=said.append)                          # the same shape: measured already
    e.close()
    assert not said
    said.clear()                                                    # another thread count: measured for it
    e = Engine(dataclasses.replace(cfg, threads=1), progress=said.append)
    e.close()
    assert said and len(tomllib.loads(cfg_home.read_text())["calibration"]) == 2
    said.clear()
    cfg_home.unlink()
    e = Engine(dataclasses.replace(cfg, calibrate="first-run"), progress=said.append)   # no GPU holds the slots
    e.close()
    assert not said and not cfg_home.exists()


def _calibrated(cfg_home: Path, tiny_glm: Path) -> None:
    """A stored first-run calibration whose uploads are cheap (a tier wins) for tiny_glm at 2 threads, pageable."""
    from moeslots.engine.llm.facts import inspect_gguf

    shape = autocal.shape_of(inspect_gguf(tiny_glm))
    calibrate.save(calibrate.Calibration(
        machine=calibrate.machine_id(), date="2026-12-06", model="m", slab_mb=1.0, upload_pageable_gbps=1e3,
        upload_pinned_gbps=0.0, cpu_gbps=1.0, base_ms=1.0, method="split", threads=2, kind="first-run",
        shape=shape, memory="pageable", version=calibrate.VERSION))


@pytest.mark.parametrize("first_x,runner_up_faster,near_tie", [(10, True, False), (10, False, False),
                                                                 (1, True, True)],
                         ids=["slow, runner-up faster", "slow, runner-up slower", "as predicted, a near tie"])
def test_auto_tries_the_runner_up_when_its_choice_is_slow(tiny_glm: Path, tmp_path: Path, cfg_home: Path,
                                                         monkeypatch: pytest.MonkeyPatch, first_x: float,
                                                         runner_up_faster: bool, near_tie: bool) -> None:
    """A fake clock makes the chosen policy decode 10x slower than predicted: after CHECK_TOKENS the runner-up takes
    over at the next reply, and after as many more tokens the faster of the two as measured stays (the runner-up,
    or back to the first choice when the runner-up is slower still); each step is said once. The same when the
    choice runs as predicted but its runner-up was predicted as close as a near tie (here: every runner-up is)."""
    _calibrated(cfg_home, tiny_glm)
    monkeypatch.setattr(autocheck, "CHECK_TOKENS", 24)
    monkeypatch.setattr(autocheck, "TIE", 1e9 if near_tie else 0.0)
    prof = _profile(tmp_path / "p.csv")
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, mtp=False, slots=6, profile=prof,
                            policy="auto", max_tokens=16, calibrate="off", mmap=True))
    try:
        d = e.residency.auto.decision
        assert d is not None and d.policy != "static" and d.runner_up() is not None, d
        first, second = d.policy, d.runner_up()
        assert second is not None
        slow = {first: first_x * d.predicted_ms, second.policy: (0.5 if runner_up_faster else 20) * d.predicted_ms}
        clock = {"now": 0.0, "seen": 0}

        def fake() -> float:                      # ms per token by the policy in force, for every token added
            n = len(e._tokens)
            clock["now"] += max(0, n - clock["seen"]) * slow[e.snapshot().policy] / 1e3
            clock["seen"] = n
            return clock["now"]

        e._clock = fake
        policies = []
        for i in range(8):
            clock["seen"] = 0
            _reply(e, f"question {i}")
            policies.append(e.snapshot().policy)
        said = [n for n in e.notices if n.startswith("auto: ")]
    finally:
        e.close()
    assert policies[0] == first and second.policy in policies, (policies, said)
    assert any("trying the runner-up" in n and (("predicted within" in n) == near_tie) for n in said), said
    if runner_up_faster:
        assert policies[-1] == second.policy and any(n.startswith("auto: kept the runner-up") for n in said), said
    else:
        assert policies[-1] == first and any(n.startswith(f"auto: back to {first}") for n in said), said
    assert len(said) == 2 and e.residency.auto.check is not None and e.residency.auto.check.state == "settled"


def _decision(first_ms: float = 10.0, second_ms: float = 12.0) -> Decision:
    return Decision("fetch-split", 32, "why", (Scored("fetch-split", 32, first_ms, 0.5),
                                               Scored("fetch-split", 16, first_ms + 0.5, 0.5),
                                               Scored("fetch", 32, second_ms, 0.5), Scored("static", 0, 20.0, 0.5)))


def test_the_check_keeps_a_choice_that_runs_as_predicted() -> None:
    c = AutoCheck(_decision(), tokens=100)
    assert c.second is not None and (c.second.policy, c.second.tier) == ("fetch", 32)   # not another tier size
    assert c.timed(60, 0.66) is None and c.state == "checking"
    assert c.timed(60, 0.66) is None and c.state == "settled" and c.line.endswith(": kept")   # 11 ms: within 15 %
    assert c.timed(500, 50.0) is None                                                          # settled stays


def test_the_check_tries_the_runner_up_and_keeps_the_faster() -> None:
    c = AutoCheck(_decision(), tokens=100)
    assert c.timed(100, 1.3) == ("fetch", 32) and c.state == "trying"           # 13 ms against 10: 23 % slower
    assert c.timed(100, 1.2) is None and c.state == "settled" and "kept the runner-up" in c.line
    c = AutoCheck(_decision(), tokens=100)
    c.timed(100, 1.3)
    assert c.timed(100, 1.5) == ("fetch-split", 32) and "back to fetch-split" in c.line
    alone = AutoCheck(Decision("static", 0, "why", (Scored("static", 0, 10.0, 0.5),)), tokens=10)
    assert alone.timed(10, 1.0) is None and "no runner-up" in alone.line


def test_a_near_tie_is_measured_both_ways() -> None:
    """A runner-up predicted within 10 % of the choice (the cost model's own error) is tried even when the choice
    runs as predicted, and the faster as measured stays; one predicted 20 % slower is not."""
    c = AutoCheck(_decision(10.0, 10.8), tokens=100)
    assert c.near_tie and c.timed(100, 1.0) == ("fetch", 32) and c.state == "trying"   # 10 ms: as predicted
    assert "predicted within 10 % of it: trying the runner-up, fetch," in c.line, c.line
    assert c.timed(100, 0.9) is None and c.state == "settled" and "kept the runner-up" in c.line
    c = AutoCheck(_decision(10.0, 10.8), tokens=100)
    c.timed(100, 1.0)
    assert c.timed(100, 1.1) == ("fetch-split", 32) and "back to fetch-split" in c.line
    far = AutoCheck(_decision(10.0, 12.0), tokens=100)
    assert not far.near_tie and far.timed(100, 1.0) is None and far.line.endswith(": kept")


def test_the_runner_up_is_another_mechanism() -> None:
    """hybrid and dynamic are one mechanism (the host tier with and without a core): the runner-up of either is the
    fastest policy of another mechanism."""
    ranked = (Scored("hybrid", 8, 14.44, 0.25), Scored("dynamic", 32, 14.44, 0.25),
              Scored("fetch-split", 32, 14.91, 0.25), Scored("static", 0, 15.53, 0.25))
    ru = Decision("hybrid", 8, "why", ranked).runner_up()
    assert ru is not None and ru.policy == "fetch-split"
    ru = Decision("dynamic", 32, "why", ranked).runner_up()
    assert ru is not None and ru.policy == "fetch-split"
    ru = Decision("fetch-split", 32, "why", ranked).runner_up()
    assert ru is not None and ru.policy == "hybrid"


def test_doctor_lists_every_calibration_of_this_machine(tiny_glm: Path, cfg_home: Path) -> None:
    """`moeslots doctor` shows the full calibration and each first-run one (shape, threads, memory, time)."""
    _calibrated(cfg_home, tiny_glm)
    calibrate.save(calibrate.Calibration(machine=calibrate.machine_id(), date="2026-12-06", model="m", slab_mb=1.0,
                                         upload_pageable_gbps=5.0, upload_pinned_gbps=0.0, cpu_gbps=9.0,
                                         base_ms=1.0, method="split"))
    calibrate.save(dataclasses.replace(calibrate.load(), machine="another / GPU"))
    found = calibrate.load_all()
    assert [c.kind for c in found] == ["full", "first-run"] and found[1].threads == 2


def _row(policy: str, tier: int, ms: float) -> TierRow:
    return TierRow("uniform", 32, policy, tier, 1e3 / ms, ms, 0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, ms)


def test_the_benchs_settled_default_is_what_the_self_check_keeps() -> None:
    """`bench repick --policy default` adds a "default, settled" row: where the app's self-check would try the
    runner-up (here a near tie), the bench measures it and keeps the faster, as the app settles; a clear winner
    that runs as predicted is kept without measuring anything else."""
    tie = Decision("hybrid", 8, "why", (Scored("hybrid", 8, 14.44, 0.25), Scored("dynamic", 32, 14.44, 0.25),
                                        Scored("fetch-split", 16, 14.91, 0.25), Scored("static", 0, 15.53, 0.25)))
    asked: list[tuple[str, int]] = []

    def measure(policy: str, tier: int) -> TierRow:
        asked.append((policy, tier))
        return _row(policy, tier, 14.02)

    got = _settle(tie, _row("default", 8, 15.28), measure)
    assert asked == [("fetch-split", 16)] and got.policy == SETTLED and got.tier == 16
    assert got.ms_per_token_median == 14.02 and "kept the runner-up, fetch-split" in got.chosen, got.chosen
    asked.clear()
    slower = _settle(tie, _row("default", 8, 13.0), measure)          # the runner-up measured slower: back
    assert asked == [("fetch-split", 16)] and slower.ms_per_token_median == 13.0 and "back to hybrid" in slower.chosen
    asked.clear()
    clear = Decision("fetch-split", 16, "why", (Scored("fetch-split", 16, 10.0, 0.5), Scored("static", 0, 15.0, 0.5)))
    kept = _settle(clear, _row("default", 16, 10.2), measure)
    assert not asked and kept.policy == SETTLED and kept.ms_per_token_median == 10.2 and kept.chosen.endswith("kept")


def test_a_calibration_from_before_version_2_is_measured_again(tiny_glm: Path, cfg_home: Path) -> None:
    """A first-run calibration from before version 2 (a fetch-split share fitted on the token's sums, no host tier's
    route) counts as none, so the next session measures it again; one from now counts."""
    import dataclasses
    from types import SimpleNamespace

    from moeslots.engine.llm.facts import inspect_gguf

    facts = inspect_gguf(tiny_glm)
    pinned = SimpleNamespace(facts=facts, opts=SimpleNamespace(use_mmap=False))
    old = calibrate.Calibration(
        machine=calibrate.machine_id(), date="2026-12-06", model="m", slab_mb=1.0, upload_pageable_gbps=0.0,
        upload_pinned_gbps=20.0, cpu_gbps=30.0, base_ms=5.0, method="split", threads=2, kind="first-run",
        shape=autocal.shape_of(facts), memory="pinned", fetch_gbps=50.0, share_ms=0.03, share_cpu_gbps=40.0)
    calibrate.save(old)
    assert calibrate.load(shape=old.shape, threads=2, pinned=True) == old          # it is there...
    assert autocal.stored(pinned, 2) is None                                        # ...and stale
    calibrate.save(dataclasses.replace(old, version=calibrate.VERSION, share_overlap_ms=0.02))
    assert autocal.stored(pinned, 2) is not None
    calibrate.save(dataclasses.replace(old, share_ms=0.0, share_cpu_gbps=0.0))      # no share, but no route either
    assert autocal.stored(pinned, 2) is None
