"""Adaptive residency: re-picking residents between decode steps never changes the output (the math does not
depend on where an expert lives), moves exactly the swapped slabs, and follows the shared election rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_cache import decode_steps

from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.native import expert_cache as cache
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.runtime.engine import Engine, EngineConfig, Message, TextDelta
from moeslots.profiles.costs import CostModel
from moeslots.profiles.plan import elect

CHEAP = CostModel(slab_mb=1.0, cpu_gbps=1e-3, pcie_gbps=1e6, gpu_gbps=1000.0, base_ms=0.0)   # re-picking pays
DEAR = CostModel(slab_mb=1.0, cpu_gbps=10.0, pcie_gbps=1e-6, gpu_gbps=1000.0, base_ms=0.0)   # uploads never pay


@pytest.fixture(scope="module")
def prof(tiny_glm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A routing profile of the tiny GLM (64 sampled decode tokens), recorded once for the auto tests."""
    from moeslots.engine.runtime.record import record

    d = tmp_path_factory.mktemp("prof")
    (d / "p.txt").write_text("hello")
    record(tiny_glm, [d / "p.txt"], d / "prof.csv", n_decode=64, threads=2, temperature=1.0)
    return d / "prof.csv"


def test_elect_rule() -> None:
    scores = np.array([5, 0, 9, 9, 1, 7], np.float64)
    # residents 1 (score 0) and 4 (1): the best candidates 2, 3 (9, ties -> lower id first) replace them
    assert elect(scores, [1, 4], max_swaps=4) == [(0, 2), (1, 3)]
    assert elect(scores, [1, 4], max_swaps=1) == [(0, 2)]
    assert elect(scores, [2, 3], max_swaps=4) == []                    # already the best
    assert elect(scores, [0, 2], max_swaps=4, margin=0.5) == [(0, 3)]  # 9 > 5 * 1.5; 7 is not > 9 * 1.5


def test_swaps_keep_logits_exact_and_move_slabs(tiny_qwen: Path) -> None:
    with Model(tiny_qwen, LoadOptions(extra_bufts=False)) as m, Context(m, n_ctx=128, threads=2) as ctx:
        f = m.facts
        toks = [int(t) for t in np.random.default_rng(5).integers(0, 300, 30)]
        stock = decode_steps(ctx, toks, 4)
        m.set_slots(SlotPlan.uniform(f.moe_layers, 4, f.n_expert), pack_host=True)
        before = cache.pack_bytes(m.ptr)
        ctx.reset()
        ctx.decode(toks[:4], prompt=True)
        got = [ctx.logits().copy()]
        rng = np.random.default_rng(1)
        resident = {il: list(range(4)) for il in f.moe_layers}
        moved = 0
        for i, t in enumerate(toks[4:]):
            il = f.moe_layers[i % len(f.moe_layers)]
            e = int(rng.choice([x for x in range(f.n_expert) if x not in resident[il]]))
            slot = i % 4
            moved += cache.swap(m.ptr, il, slot, e)
            resident[il][slot] = e
            ctx.decode([t])
            got.append(ctx.logits().copy())
        assert all(np.array_equal(a, b) for a, b in zip(stock, got))
        assert moved == len(toks[4:]) * f.slab_bytes            # exactly the swapped slabs
        assert cache.pack_bytes(m.ptr) == before
        assert cache.swap(m.ptr, f.moe_layers[0], 0, resident[f.moe_layers[0]][0]) == 0   # already there
        with pytest.raises(cache.CacheError):
            cache.swap(m.ptr, f.moe_layers[0], 1, resident[f.moe_layers[0]][0])          # resident elsewhere


def stage_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each poll between decodes waits for the copy in flight (which still runs on the worker thread while the
    previous decode runs): how many copies land in a short generation no longer depends on how busy the machine
    is (a 2-core CI runner once committed none of them in 24 tokens)."""
    poll = cache.Stager.poll
    monkeypatch.setattr(cache.Stager, "poll", lambda self, plan, wait=False: poll(self, plan, wait=True))


@pytest.mark.parametrize("overlap", [False, True])
def test_engine_repick_every_token_matches_static_output(tiny_glm: Path, overlap: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Synchronous swaps, or copies staged on a worker thread while decoding and committed between decodes (patch
    0011): either way the text equals the static cache's, byte for byte."""
    if overlap:
        stage_waits(monkeypatch)
    plan = SlotPlan.uniform([1, 2], 4, 16)
    texts = []
    for every in (0, 1):
        e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=24, mtp=False, slots=plan,
                                repick_every=every, repick_swaps=2, repick_margin=0.0, repick_overlap=overlap))
        try:
            texts.append("".join(ev.text for ev in e.chat([Message("user", "hi")]) if isinstance(ev, TextDelta)))
            snap = e.snapshot()
            if every:
                # overlapped: a re-pick waits until the last one's copies are in (one stage per layer per token)
                assert snap.repicks >= (5 if overlap else 20) and snap.repick_swaps > 0
                assert snap.repick_mb * 1e6 == snap.repick_swaps * e.model.facts.slab_bytes
                assert snap.upload_mb_per_token > 0
            else:
                assert snap.repicks == 0 and snap.upload_mb_per_token == 0
        finally:
            e.close()
    assert texts[0] == texts[1]


def test_set_repick_turns_it_on_and_off(tiny_glm: Path) -> None:
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=12, mtp=False,
                            slots=SlotPlan.uniform([1, 2], 4, 16)))
    try:
        assert "every 2 tokens" in e.set_repick(2, swaps=1)
        list(e.chat([Message("user", "hi")]))
        assert e.snapshot().repicks >= 4
        assert "static" in e.set_repick(0)
        n = e.snapshot().repicks
        list(e.chat([Message("user", "hi"), Message("assistant", "x"), Message("user", "again")]))
        assert e.snapshot().repicks == n
    finally:
        e.close()


def test_repick_auto_from_the_profile(tiny_glm: Path, prof: Path, tmp_path: Path) -> None:
    """The profile simulated under the costs decides: on a profile whose routing moves (experts 0-3 for 200 tokens,
    then 4-7), uploads that cost nothing against a slow CPU re-pick, uploads that never pay stay static; the
    interval chosen is the one in force, and the snapshot says why. Without a calibration (the tests have none) the
    H200 box's costs decide, the same way every time, on the recorded profile too."""
    drift = tmp_path / "drift.csv"
    drift.write_text("# arch=glm4moe n_layer=4 n_expert=16 k=4\npos,layer,id0,id1,id2,id3\n" + "".join(
        f"{t},{il},{','.join(str(x + 4 * (t >= 200)) for x in range(4))}\n" for t in range(400) for il in (1, 2)))
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, slots=4, profile=drift, mtp=False))
    try:
        why = e.set_repick_auto(CHEAP)
        every = e.snapshot().repick_every
        assert why.startswith(f"re-pick every {every} tokens: ") and every in (1, 16, 100), why
        assert why.endswith("[given costs]") and e.snapshot().repick_auto == f"auto: {why}"
        why = e.set_repick_auto(DEAR)
        assert why.startswith("static: ") and "would not pay back its uploads" in why, why
        assert e.snapshot().repick_every == 0 and e.snapshot().repick_auto == f"auto: {why}"
        why = e.set_repick_auto()
        assert why.endswith("[default costs (H200 box, pinned uploads at 25.6 GB/s): run `moeslots doctor "
                            "--calibrate MODEL` for this machine's]"), why
        assert e.set_repick_auto() == why                      # deterministic
    finally:
        e.close()
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, slots=4, profile=prof, mtp=False))
    try:
        why, every = e.set_repick_auto(), e.snapshot().repick_every
        assert why.startswith(f"re-pick every {every} tokens: " if every else "static: "), why   # what is in force
        assert e.set_repick_auto() == why                      # deterministic
    finally:
        e.close()
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, mtp=False))
    try:
        with pytest.raises(Exception, match="needs a profile"):
            e.set_repick_auto()
    finally:
        e.close()


def test_stage_on_a_thread_commit_between_decodes(tiny_qwen: Path) -> None:
    """Patch 0005: an expert is copied into the spare entry on a worker thread while the context decodes, then
    committed between two decodes; every logit equals the stock run's, the moved expert answers `swap` as already
    placed, and misuse is refused."""
    import threading

    with Model(tiny_qwen, LoadOptions(extra_bufts=False)) as m, Context(m, n_ctx=256, threads=2) as ctx:
        f = m.facts
        toks = [int(t) for t in np.random.default_rng(9).integers(0, 300, 80)]
        stock = decode_steps(ctx, toks, 4)

        m.set_slots(SlotPlan.uniform(f.moe_layers, 3, f.n_expert), pack_host=True)       # no spare entry
        with pytest.raises(cache.CacheError, match="no spare"):
            cache.stage(m.ptr, f.moe_layers[0], 7)
        plan = SlotPlan({il: (0, 1, 2) for il in f.moe_layers})
        m.set_slots(plan, pack_host=True, spare=True)
        with pytest.raises(cache.CacheError):
            cache.stage(m.ptr, f.moe_layers[0], 1)                  # resident already
        with pytest.raises(cache.CacheError, match="nothing staged"):
            cache.commit(m.ptr, f.moe_layers[0], 0)

        ctx.reset()
        ctx.decode(toks[:4], prompt=True)
        got = [ctx.logits().copy()]
        rng = np.random.default_rng(1)
        slots = {il: list(v) for il, v in plan.layers.items()}
        for i, t in enumerate(toks[4:]):
            il = f.moe_layers[i % len(f.moe_layers)]
            e = int(rng.choice([x for x in range(f.n_expert) if x not in slots[il]]))
            out: list[int] = []
            worker = threading.Thread(target=lambda il=il, e=e, out=out: out.append(cache.stage(m.ptr, il, e)))
            worker.start()
            ctx.decode([t])                                         # decodes while the copy runs
            got.append(ctx.logits().copy())
            worker.join()
            slot = i % 3
            cache.commit(m.ptr, il, slot)                           # between decodes
            slots[il][slot] = e
            assert out[0] > 0 and cache.swap(m.ptr, il, slot, e) == 0
        for a, b in zip(stock, got):
            assert np.array_equal(a, b)


def test_close_and_reconfigure_with_copies_in_flight(tiny_glm: Path) -> None:
    import threading

    plan = SlotPlan.uniform([1, 2], 4, 16)
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=16, mtp=False, slots=plan,
                            repick_every=1, repick_swaps=4, repick_margin=0.0))
    try:
        list(e.chat([Message("user", "hi")]))
        assert "4 slots" in e.set_slots(plan)                        # waits for a stage in flight, drops the rest
        list(e.chat([Message("user", "hi"), Message("assistant", "x"), Message("user", "more")]))
    finally:
        e.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("moeslots-stage")]


def test_swaps_and_commits_keep_the_graph_and_the_stats_follow_them(tiny_qwen: Path) -> None:
    """Patch 0002: graphs read both maps when they run, so a swap or a commit between decodes reuses the graph (no
    rebuild per re-pick), and the stats count each decode's hits against the residents of that moment."""
    with Model(tiny_qwen, LoadOptions(extra_bufts=False)) as m, Context(m, n_ctx=128, threads=2) as ctx:
        f, L = m.facts, m._L
        m.set_slots(SlotPlan.uniform(f.moe_layers, 4, f.n_expert), pack_host=True, spare=True)
        resident = {il: list(range(4)) for il in f.moe_layers}
        ctx.enable_stats(ring_rows=4096)
        toks = [int(t) for t in np.random.default_rng(9).integers(0, 300, 20)]
        ctx.decode(toks[:4], prompt=True)
        ctx.decode([toks[4]])
        rng = np.random.default_rng(2)
        for i, t in enumerate(toks[5:]):
            il = f.moe_layers[i % len(f.moe_layers)]
            e = int(rng.choice([x for x in range(f.n_expert) if x not in resident[il]]))
            slot = i % 4
            if i % 2:
                cache.swap(m.ptr, il, slot, e)
            else:
                cache.stage(m.ptr, il, e)
                cache.commit(m.ptr, il, slot)
            resident[il][slot] = e
            before, reused = ctx.read_stats(), L.llama_perf_context(ctx.ptr).n_reused
            ctx.decode([t])
            after = ctx.read_stats()
            assert L.llama_perf_context(ctx.ptr).n_reused == reused + 1, f"graph rebuilt after step {i}"
            rows = after.ring[-len(f.moe_layers):]                       # this decode: one row per MoE layer
            for row in rows:
                lay, ids = int(row[1]), row[2:]
                hits = sum(int(x) in resident[lay] for x in ids)
                assert int(after.hits[lay] - before.hits[lay]) == hits
                assert int(after.misses[lay] - before.misses[lay]) == len(ids) - hits


def test_repick_auto_decides_again_on_the_chat_s_own_routing(tiny_glm: Path, prof: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`--repick auto` (repick_auto_every > 0): the load-time decision (static under dear uploads) is taken again
    after enough decode tokens, on those tokens, from the plan held when they began; with uploads this machine
    makes cheap it switches re-picking on, says so in the snapshot, and the text stays the static cache's. A
    choice by hand (F3) ends the live decisions."""
    asks = ["tell me about the experts", "and more"]
    texts = []
    for live in (0, 16):
        e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, slots=2, profile=prof, mtp=False,
                                max_tokens=40, repick_auto_every=live, repick_margin=0.0))
        try:
            monkeypatch.setattr(e, "cost_model", lambda: (CHEAP, "test costs"))
            assert e.set_repick_auto(DEAR).startswith("static")
            snap = e.snapshot()
            assert snap.repick_every == 0 and snap.repick_auto.startswith("auto: static")
            texts.append([_reply_text(e, asks[0])])
            snap = e.snapshot()
            if live:
                assert snap.repick_auto.startswith("auto @40 tokens, static -> re-pick every"), snap.repick_auto
                assert snap.repick_every in (1, 16) and "this session's last 40 tokens" in snap.repick_auto
            else:
                assert snap.repick_every == 0 and snap.repick_auto.startswith("auto: static")  # decided once
            texts[-1].append(_reply_text(e, asks[1]))
            assert (e.snapshot().repicks > 0) == bool(live)
            if live:
                assert "(re-pick auto off)" in e.set_repick(0)                   # by hand: live decisions end
                _reply_text(e, asks[0])
                snap = e.snapshot()
                assert snap.repick_every == 0 and snap.repick_auto == ""
        finally:
            e.close()
    assert texts[0] == texts[1]                       # the re-picked second reply too: placement is not math


def _reply_text(e: Engine, ask: str) -> str:
    e.new_chat()
    return "".join(ev.text for ev in e.chat([Message("user", ask)]) if isinstance(ev, TextDelta))


def test_repick_auto_live_with_mtp(tiny_glm: Path, prof: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With MTP the ring also holds the NextN block's rows and verify batches: live auto scores the slot layers'
    decode rows, switches, and the text is the same as with no re-picks."""

    texts = []
    for live in (0, 16):
        e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, slots=2, profile=prof, mtp=True,
                                max_tokens=40, repick_auto_every=live, repick_margin=0.0))
        try:
            assert e.mtp is not None
            monkeypatch.setattr(e, "cost_model", lambda: (CHEAP, "test costs"))
            if live:
                e.set_repick_auto(CostModel(pcie_gbps=1e-6))                     # static at load
            texts.append([_reply_text(e, "tell me about the experts")])
            if live:
                snap = e.snapshot()
                assert snap.repick_auto.startswith("auto @40 tokens, static -> re-pick") and snap.repick_every > 0
            texts[-1].append(_reply_text(e, "and more"))
            assert (e.snapshot().repicks > 0) == bool(live)
        finally:
            e.close()
    assert texts[0] == texts[1]


def test_live_auto_keeps_state_on_trouble(tiny_glm: Path, prof: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Live auto never ends a reply or overrides the user: a ring too short for the tokens to score, a cost model
    that raises (a calibration edited mid-chat), or F3 pressed while it decides."""
    from moeslots.engine.runtime.engine import Done
    from moeslots.profiles import repick

    def engine(**kw: object) -> Engine:
        e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, slots=2, profile=prof, mtp=False,
                                max_tokens=40, repick_auto_every=16, repick_margin=0.0, **kw))
        monkeypatch.setattr(e, "cost_model", lambda: (CHEAP, "test costs"))
        e.set_repick_auto(CostModel(pcie_gbps=1e-6))                   # static at load
        return e

    def reply(e: Engine) -> Done:
        e.new_chat()
        return [ev for ev in e.chat([Message("user", "tell me about the experts")]) if isinstance(ev, Done)][0]

    e = engine(stats_ring=2 * 10)                      # 10 tokens of the 2 MoE layers' rows: 40 to score
    try:
        assert reply(e).stats.tokens == 40
        snap = e.snapshot()
        assert snap.repick_every == 0 and "kept (the routing ring holds" in snap.repick_auto
    finally:
        e.close()
    e = engine()
    try:
        def broken() -> tuple[CostModel, str]:
            raise TypeError("unsupported operand type(s) for /: 'float' and 'str'")
        monkeypatch.setattr(e, "cost_model", broken)
        assert reply(e).stats.tokens == 40                                # the reply ends normally
        assert "kept (unsupported operand" in e.snapshot().repick_auto
        monkeypatch.setattr(e, "cost_model", lambda: (CHEAP, "test costs"))
        real = repick.choose_repick_from

        def f3_meanwhile(*a: object, **k: object) -> tuple[int, str]:
            out = real(*a, **k)
            e.set_repick(0)                                               # F3 on the app's thread, mid-decision
            return out

        monkeypatch.setattr(repick, "choose_repick_from", f3_meanwhile)
        reply(e)
        snap = e.snapshot()
        assert snap.repick_every == 0 and snap.repick_auto == ""          # the user's choice stands
    finally:
        e.close()
