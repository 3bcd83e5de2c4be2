"""Residency policies through the Engine (`--policy static|hybrid|dynamic|auto`, engine.native_tier): the tier
moves experts while decoding and the text never changes (the same greedy text as the static cache, with MTP
verify batches), the simulator (profiles.hybrid, the ENGINE mechanism) predicts the engine's hits and uploads
exactly on the same replayed routing, and auto follows the calibration. (The op-level exactness of the tier, logits
against the stock run: test_native_tier.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from moeslots.engine.bench import tier as tier_bench
from moeslots.engine.machine import calibrate
from moeslots.engine.native import replay
from moeslots.engine.native import routing_stats as stats_mod
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.native.tier import masks
from moeslots.engine.runtime.engine import Engine, EngineConfig, Message, TextDelta
from moeslots.profiles.costs import CostModel
from moeslots.profiles.hybrid import ENGINE, simulate_hybrid
from moeslots.profiles.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
CHAT = ROOT / "profiles/data/moeslots-tiny-glm4moe-chat.csv"
CHEAP = CostModel(slab_mb=1.0, cpu_gbps=1.0, pcie_gbps=1e3, gpu_gbps=1000.0, base_ms=1.0)   # uploads pay
DEAR = CostModel(slab_mb=1.0, cpu_gbps=10.0, pcie_gbps=1e-6, gpu_gbps=1000.0, base_ms=0.0,
                 fetch_gbps=1e-6)                                                          # uploads never fit


def _reply(e: Engine, ask: str) -> str:
    e.new_chat()
    return "".join(ev.text for ev in e.chat([Message("user", ask)]) if isinstance(ev, TextDelta))


def test_every_policy_gives_the_static_text(tiny_glm: Path) -> None:
    """static, hybrid, dynamic, fetch, fetch-split through the Engine, with MTP drafts (verify batches, which step
    the host tier too; the GPU-stepped one (fetch: 2 core + 4 tier slots, k 4) only in batches whose picks fit in it):
    the same greedy replies as 0 slots; the tier's uploads show in the plan, the snapshot's split and the uploads
    (fetch-split under the default costs: the CPU takes a share of every stepped batch's misses)."""
    texts, cpu_of = {}, {}
    for policy, slots in (("static", 0), ("static", 6), ("hybrid", 6), ("dynamic", 6), ("fetch", 6),
                          ("fetch-split", 6)):
        e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=40, mtp=True, policy=policy,
                                slots=SlotPlan.uniform([1, 2], slots, 16) if slots else 0))
        try:
            texts[policy, slots] = [_reply(e, "tell me about the experts"), _reply(e, "and more")]
            snap = e.snapshot()
            core, tier, cpu = snap.split_per_token
            cpu_of[policy] = cpu
            # a policy that splits misses by cost names the costs it splits by
            assert ("[default costs (H200 box" in snap.policy_line) == (policy in ("hybrid", "dynamic", "fetch-split"))
            if policy in ("fetch", "fetch-split"):
                assert snap.policy == policy and snap.tier_slots == 4
                assert snap.policy_line.startswith(f"{policy}: 2 core + 4 tier")
                # verify batches over the tier (k * n > 4) only read it: their misses are computed on the CPU, counted
                assert tier > 0 and snap.tier_uploads_per_token > 0 and snap.upload_mb_per_token > 0
                assert cpu > 0 and snap.cpu_experts_per_token == cpu
                assert e.residency.tier.tokens >= e.state.decode_tokens
                assert e.state.plan != SlotPlan.uniform([1, 2], 6, 16)
            elif policy in ("hybrid", "dynamic"):
                assert snap.policy == policy and snap.tier_slots == (1 if policy == "hybrid" else 6)
                assert snap.policy_line.startswith(f"{policy}: {6 - snap.tier_slots} core + {snap.tier_slots} tier")
                assert tier > 0 and snap.tier_uploads_per_token > 0 and snap.upload_mb_per_token > 0
                # verify batches step
                assert snap.mtp_drafted > 0 and e.residency.tier.tokens >= e.state.decode_tokens
                assert snap.cpu_experts_per_token == cpu          # host-memory work: the tier's CPU misses
                assert (core == 0) == (policy == "dynamic")
                assert e.state.plan != SlotPlan.uniform([1, 2], 6, 16)
            else:
                assert snap.policy == "static" and tier == 0 and snap.tier_uploads_per_token == 0
                assert snap.policy_line == ("static" if slots else "")
            assert core + tier + cpu > 0
        finally:
            e.close()
    assert len({tuple(v) for v in texts.values()}) == 1, texts
    assert cpu_of["fetch-split"] > 0 and cpu_of["fetch"] > 0   # (fetch: the verify batches over its tier)
    # the CPU takes a share of the stepped batches: with every batch a single token (no drafts: how often the
    # adaptive switch drafts follows the machine's speed, and with it how many batches are verify batches, whose
    # misses the CPU computes under either policy), fetch leaves the CPU nothing and fetch-split gives it a share
    for policy in ("fetch", "fetch-split"):
        e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=24, mtp=False, policy=policy,
                                slots=SlotPlan.uniform([1, 2], 6, 16)))
        try:
            _reply(e, "tell me about the experts")
            core, tier, cpu = e.snapshot().split_per_token
            assert tier > 0 and (cpu > 0) == (policy == "fetch-split"), (policy, core, tier, cpu)
        finally:
            e.close()


def test_the_simulator_predicts_the_engine(tiny_glm: Path, cfg_home: Path) -> None:
    """The Engine's hybrid tier on replayed routing (the bundled chat trace): the native stats' hits, the tier's
    hits, its uploads and the CPU misses equal the simulator's on the same rows, from the same core, first tier and
    costs (a calibration where an upload costs what a CPU expert does: about half the misses go up)."""
    calibrate.save(calibrate.Calibration(machine=calibrate.machine_id(), date="2026-12-04", model="m", slab_mb=1.0,
                                         upload_pageable_gbps=1.0, upload_pinned_gbps=1.0, cpu_gbps=1.0, base_ms=1.0,
                                         method="split"))
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=64, mtp=False,
                            policy=Policy("hybrid", 3), slots=SlotPlan.uniform([1, 2], 8, 16, offset=5)))
    try:
        f = e.model.facts
        table = replay.from_trace(CHAT, f.n_expert, f.n_expert_used)
        replay.set_replay(e.ctx.ptr, table)
        runner = e.residency.tier
        assert runner is not None
        plan0, cost = runner.plan, runner.cost
        stats_mod.reset(e.ctx.ptr)
        _reply(e, "hi")
        n, end = runner.tokens, e.ctx.n_past
        assert n >= 60
        P = table.per_layer([1, 2])[end - n:end]                            # the decode positions' rows
        core, first = masks(plan0, 3, f.n_expert)
        sim = simulate_hybrid(P, core, 3, cost, initial=first, mech=ENGINE)
        st = e.ctx.read_stats()
        assert st.hit_rate == pytest.approx(sim.hit_rate, abs=1e-12)
        assert runner.counts.uploads == round(sim.sync_uploads_per_token * n) > 5
        assert runner.counts.tier_hits == round(sim.tier_hit_rate * sim.hit_rate * n * 2 * 4)
        assert runner.counts.cpu == round(sim.cpu_picks_per_token * n)
        snap = e.snapshot()
        assert snap.split_per_token[2] * n == pytest.approx(runner.counts.cpu)
        assert snap.tier_uploads_per_token * n == pytest.approx(runner.counts.uploads)
    finally:
        e.close()


def test_bench_rows_agree_with_their_simulator_column(tiny_glm: Path) -> None:
    """`bench repick --policy ...`: each row's measured hits, uploads and CPU misses are the simulator's; dear uploads
    copy nothing and auto then keeps static."""
    used: dict = {}
    rows = tier_bench.run_tiers(tiny_glm, [8], ["hybrid", "dynamic"], [str(CHAT)], n_decode=48, profile_rows=256,
                                threads=2, pack_host=True, cost=CHEAP, log=lambda _: None, used=used)
    assert used["cost"] == dataclasses.asdict(CHEAP) and used["source"] == "given"     # what predicted the rows
    for r in rows:
        assert (r.hit_rate, r.uploads_per_token) == (pytest.approx(r.sim_hit_rate, abs=1e-12),
                                                     pytest.approx(r.sim_uploads_per_token, abs=1e-12))
        assert r.uploads_per_token > 0 and r.cpu_per_token == pytest.approx(r.sim_cpu_per_token)
    dear = tier_bench.run_tiers(tiny_glm, [8], ["hybrid", "auto"], [str(CHAT)], n_decode=24, profile_rows=256,
                                threads=2, pack_host=True, cost=DEAR, log=lambda _: None)
    assert dear[0].uploads_per_token == dear[0].sim_uploads_per_token == 0
    assert dear[1].tier == 0 and dear[1].chosen.startswith("static")


@pytest.fixture()
def cfg_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path


def test_bench_repeats_rows_and_reports_their_median(tiny_glm: Path) -> None:
    """`bench repick --policy ... -r 3`: one row per policy, measured three times (counts unchanged, the speed the
    median of the three, with its range), and the same counts as one measurement."""
    one = tier_bench.run_tiers(tiny_glm, [8], ["static", "dynamic"], [str(CHAT)], n_decode=16, profile_rows=256,
                               threads=2, pack_host=True, cost=CHEAP, log=lambda _: None)
    lines: list[str] = []
    three = tier_bench.run_tiers(tiny_glm, [8], ["static", "dynamic"], [str(CHAT)], n_decode=16, profile_rows=256,
                                 threads=2, pack_host=True, cost=CHEAP, reps=3, log=lines.append)
    assert [r.policy for r in three] == ["static", "dynamic"] and all(r.reps == 3 for r in three)
    for a, b in zip(one, three):
        assert (a.hit_rate, a.uploads_per_token, a.cpu_per_token) == (b.hit_rate, b.uploads_per_token, b.cpu_per_token)
        assert a.reps == 1 and b.tok_s_min <= b.decode_tok_s <= b.tok_s_max
        # each measurement kept, in order (`bench repick --json`: how far one reading moves from the next)
        assert len(b.rep_ms) == 3 and b.ms_per_token_median == sorted(b.rep_ms)[1] and len(a.rep_ms) == 1
    assert len(lines) == 2 and all("–" in ln.split("|")[5] for ln in lines)        # "median (min–max)"
    with pytest.raises(ValueError):
        tier_bench.run_tiers(tiny_glm, [8], ["static"], [str(CHAT)], n_decode=16, profile_rows=256, reps=0,
                             pack_host=True, log=lambda _: None)


def test_bench_takes_the_cpu_rate_of_its_thread_count(tiny_glm: Path, cfg_home: Path) -> None:
    """A calibration with the CPU rate by thread count: `bench repick --policy` at 1 thread splits misses by the
    1-thread rate (slow CPU: every miss uploaded), at 2 threads by the 2-thread one (fast CPU: none)."""
    calibrate.save(calibrate.Calibration(machine=calibrate.machine_id(), date="2026-12-04", model="m", slab_mb=1.0,
                                         upload_pageable_gbps=1.0, upload_pinned_gbps=0.0, cpu_gbps=1.0, base_ms=1.0,
                                         method="split", threads=2, cpu_threads=(1, 2), cpu_gbps_threads=(1e-6, 1e6)))
    got = {t: tier_bench.run_tiers(tiny_glm, [8], ["dynamic"], [str(CHAT)], n_decode=16, profile_rows=256, threads=t,
                                   pack_host=True, log=lambda _: None)[0] for t in (1, 2)}
    assert got[1].cpu_per_token == 0 and got[1].uploads_per_token > 0
    assert got[2].uploads_per_token == 0 and got[2].cpu_per_token > 0


def _drift_profile(path: Path) -> Path:
    """Experts 0-3 for 300 tokens, then 8-11: a profile whose second half a static core from its first misses."""
    path.write_text("# arch=glm4moe n_layer=4 n_expert=16 k=4\npos,layer,id0,id1,id2,id3\n" + "".join(
        f"{t},{il},{','.join(str(x + 8 * (t >= 300)) for x in range(4))}\n" for t in range(600) for il in (1, 2)))
    return path


def test_policy_auto_follows_the_calibration(tiny_glm: Path, tmp_path: Path, cfg_home: Path) -> None:
    prof = _drift_profile(tmp_path / "drift.csv")
    base = calibrate.Calibration(machine=calibrate.machine_id(), date="2026-12-03", model="m", slab_mb=1.0,
                                 upload_pageable_gbps=1e3, upload_pinned_gbps=0.0, cpu_gbps=1.0, base_ms=1.0,
                                 method="split")
    got = {}
    for name, cal in (("cheap", base), ("dear", dataclasses_replace(base, upload_pageable_gbps=1e-6))):
        calibrate.save(cal)
        e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, mtp=False, slots=6, profile=prof,
                                policy="auto", mmap=True))
        try:
            snap = e.snapshot()
            got[name] = (snap.policy, snap.tier_slots, snap.policy_line)
        finally:
            e.close()
    assert got["cheap"][0] in ("hybrid", "dynamic") and got["cheap"][1] > 0, got
    assert got["cheap"][2].startswith(f"auto: {got['cheap'][0]}: ") and "calibrated on this machine" in got["cheap"][2]
    assert got["dear"][:2] == ("static", 0) and got["dear"][2].startswith("auto: static: "), got


def dataclasses_replace(c: calibrate.Calibration, **kw: float) -> calibrate.Calibration:
    import dataclasses

    return dataclasses.replace(c, **kw)


def test_policy_and_repick_are_one_or_the_other(tiny_glm: Path) -> None:
    from moeslots.engine.errors import EngineError

    with pytest.raises(EngineError, match="both move slots"):
        Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, mtp=False, policy="hybrid", repick_every=4,
                            slots=SlotPlan.uniform([1, 2], 4, 16)))
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, mtp=False, policy="hybrid", max_tokens=8,
                            slots=SlotPlan.uniform([1, 2], 4, 16)))
    try:
        assert e.residency.tier is not None
        e.set_repick(4)                                   # F3: re-picks win, the tier stops
        assert e.residency.tier is None and e.snapshot().policy == "static" and e.cfg.policy.name == "static"
        _reply(e, "hi")
        assert e.snapshot().repicks > 0
    finally:
        e.close()


def test_repicks_take_over_from_what_the_tier_left(tiny_glm: Path) -> None:
    """F3 during a dynamic tier: the tier stops, and the engine's plan is what the cache holds then (every resident
    answers `swap` as already in its slot), so re-picks start from the real slots."""
    from moeslots.engine.native import expert_cache as cache

    start = SlotPlan.uniform([1, 2], 6, 16)
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=40, mtp=False, policy="dynamic",
                            slots=start))
    try:
        assert len(_reply(e, "tell me about the experts")) > 0
        assert e.residency.tier is not None and e.residency.tier.counts.uploads > 0
        e.set_repick(1000)                                                     # F3: re-picks (none due yet)
        assert e.residency.tier is None and e.state.plan != start
        for il, experts in e.state.plan.layers.items():
            assert all(cache.swap(e.model.ptr, il, slot, x) == 0 for slot, x in enumerate(experts))
        _reply(e, "and more")                                                  # the chat goes on
    finally:
        e.close()


def test_repicks_asked_for_mid_reply_end_the_tier_between_decodes(tiny_glm: Path) -> None:
    """F3 while a reply is being decoded (the app's thread; here between two of its deltas): the tier is not turned
    off under a running decode but by the generating thread before its next decode, and the reply's text is the
    static cache's (exact), as is the next reply's under re-picks."""
    start = SlotPlan.uniform([1, 2], 6, 16)
    ref = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=40, mtp=False, slots=start))
    try:
        want = [_reply(ref, "tell me about the experts"), _reply(ref, "and more")]
    finally:
        ref.close()
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=40, mtp=False, policy="dynamic",
                            slots=start))
    try:
        e.new_chat()
        got, seen = [], []
        for ev in e.chat([Message("user", "tell me about the experts")]):
            if not isinstance(ev, TextDelta):
                continue
            got.append(ev.text)
            seen.append(e.residency.tier is not None)
            if len(got) == 3:
                e.set_repick(4)                                    # during the reply: the tier stays until a step
                assert e.residency.tier is not None and e.residency.end_tier_pending
        assert seen[:3] == [True] * 3 and not seen[-1]             # ended by the generating thread, mid-reply
        assert e.residency.tier is None and e.cfg.policy.name == "static" and e.cfg.repick_every == 4
        assert "".join(got) == want[0]
        assert _reply(e, "and more") == want[1]
    finally:
        e.close()


def test_repicks_asked_for_during_a_slot_change_end_the_tier_with_it(tiny_glm: Path) -> None:
    """F3 while another thread holds the engine for a slot change (here: _busy held): the tier end waits for the
    engine, and the next plan goes in static with re-picks on (no tier for it, no "both move slots" error), and
    the counts of the tier's last decode are kept."""
    start = SlotPlan.uniform([1, 2], 6, 16)
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=24, mtp=False, policy="hybrid",
                            slots=start))
    try:
        _reply(e, "tell me about the experts")
        assert e.residency.tier is not None
        with e.state.busy:                                          # a slot change in progress
            e.set_repick(4)
            assert e.residency.end_tier_pending and e.residency.tier is not None
        e.set_slots(SlotPlan.uniform([1, 2], 5, 16))
        assert e.residency.tier is None and not e.residency.end_tier_pending
        assert e.cfg.policy.name == "static" and e.cfg.repick_every == 4 and e.snapshot().policy == "static"
        assert len(_reply(e, "and more")) > 0
    finally:
        e.close()
