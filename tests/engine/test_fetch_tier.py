"""The tier stepped on the device that holds the pack (patch 0008, GGML_OP_MOE_FETCH, `--policy fetch`): every miss
of a decode batch whose picks fit in the tier is copied into it by the device itself, none is computed on the CPU,
and the layer runs without its host chain; other batches read the tier as it stands. With a CPU share (`--policy
fetch-split`) the device copies only part of each stepped batch's misses and publishes the host chain's inputs, which
the CPU's take node reads to compute the others. It never changes the output
(bit-identical logits to stock on the CPU, GPU rounding with MOESLOTS_TEST_PACK=gpu), its counts equal the
simulator's (profiles.hybrid with the FETCH mechanism) exactly, and when it ends the host chain's map follows the
device's."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from exactness import _tokens
from test_native_tier import CHAT, CHUNKS, ON_GPU, PACK_HOST, _same, _script, stepped_counts

from moeslots.engine.errors import EngineError
from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.native import replay
from moeslots.engine.native import routing_stats as stats_mod
from moeslots.engine.native import tier as native_tier
from moeslots.engine.native.expert_cache import CacheError, SlotPlan, swap
from moeslots.engine.native.tier import masks
from moeslots.profiles.costs import CostModel
from moeslots.profiles.hybrid import ENGINE, FETCH, FETCH_SPLIT, Tier, simulate_hybrid

COST = CostModel(slab_mb=1.0, cpu_gbps=1.0, pcie_gbps=1.0, gpu_gbps=1000.0, base_ms=1.0)
# a CPU share: a CPU expert costs 1.5 GPU copies, so of m misses the device copies 3m/5 (rounded, the fewest on ties)
SHARE = CostModel(slab_mb=1.0, cpu_gbps=2.0, pcie_gbps=1.0, gpu_gbps=1000.0, base_ms=1.0, fetch_gbps=3.0)
# with the pack on the GPU, the GPU reads the experts from pinned host memory: the models load without mmap
LOAD = LoadOptions(extra_bufts=False, use_mmap=not ON_GPU)


@pytest.mark.parametrize("share", [False, True], ids=["fetch", "fetch-split"])
@pytest.mark.parametrize("slots,tier", [(12, 8), (12, 12)])       # a core + tier, all slots a tier
def test_the_fetch_tier_keeps_logits_exact_and_its_core(tiny_qwen: Path, slots: int, tier: int, share: bool) -> None:
    """A prompt, then decode batches of 1..8 tokens: batches whose picks fit (k * n <= tier) step it, the others
    read it as it stands (their misses on the CPU); with a CPU share a stepped batch's misses are split between the
    device's copies and the CPU, whose inputs come through the stage. Logits equal stock's; afterwards, with the tier
    off, the host chain's map follows where the tier left the experts (checked: with the host map not rebuilt, the
    decodes after the tier differ from stock; with the take's host plane dropped, the fetch-split rows differ)."""
    with Model(tiny_qwen, LOAD) as m, Context(m, n_ctx=256, threads=2) as ctx:
        f = m.facts
        ctx.enable_stats(ring_rows=4096)
        stock = _script(ctx)
        plan = SlotPlan.uniform(f.moe_layers, slots, f.n_expert)
        m.set_slots(plan, pack_host=PACK_HOST)
        t = native_tier.NativeTier(m.ptr, plan, tier, SHARE if share else COST, device=True, share=share)
        try:
            got = _script(ctx)
            t.step(force=True)
            c, now = t.counts, t.refresh()
        finally:
            t.close()
        _same(stock, got, f"fetch{'-split' if share else ''} tier of {tier}")
        # every decode batch is counted; those over the tier (k * n > tier) leave their misses to the CPU
        assert c.layer_tokens == sum(CHUNKS) * len(f.moe_layers)
        assert c.uploads > 0 and c.cpu > 0 and c.bytes == c.uploads * f.slab_bytes
        if share:
            # the CPU takes a share of the stepped batches too: more CPU misses than fetch on the same script
            m.set_slots(plan, pack_host=PACK_HOST)
            t2 = native_tier.NativeTier(m.ptr, plan, tier, COST, device=True)
            try:
                _script(ctx)
                t2.step(force=True)
            finally:
                t2.close()
            assert c.cpu > t2.counts.cpu and c.uploads < t2.counts.uploads
        assert all(now.slots_of(il)[:slots - tier] == plan.slots_of(il)[:slots - tier] for il in f.moe_layers)
        assert all(len(set(now.slots_of(il))) == slots for il in f.moe_layers)
        assert now != plan
        # the tier is off: the slots hold what it left; the host chain must compute exactly the others
        after = _script(ctx)
        _same(stock, after, "static after the fetch tier")


def _replayed(m: Model, ctx: Context, plan: SlotPlan, tier: int, table: replay.ReplayTable,
              chunks: list[int], share: bool = False) -> native_tier.TierCounts:
    m.set_slots(plan, pack_host=PACK_HOST)
    ctx.reset()
    replay.set_replay(ctx.ptr, table)
    toks = _tokens(m.n_vocab, 8 + sum(chunks), 2)
    ctx.decode(toks[:8], prompt=True)
    stats_mod.reset(ctx.ptr)
    t = native_tier.NativeTier(m.ptr, plan, tier, SHARE if share else COST, device=True, share=share)
    try:
        i = 8
        for n in chunks:
            ctx.decode(toks[i:i + n], all_logits=True)
            i += n
            t.step(n)
        t.step(0, force=True)
        return t.counts
    finally:
        t.close()


def _chat_replay(tiny_glm: Path, slots: int, tier: int, batched: bool, share: bool = False
                 ) -> tuple[native_tier.TierCounts, list[int], np.ndarray, np.ndarray, np.ndarray, int, int, int]:
    """The bundled chat trace replayed from position 8 through a GPU-stepped tier, one token at a time or in verify
    batches of 1..8: the engine's counts, the batch sizes, the replayed picks P [n, L, k], the plan's core and first
    tier masks, the trunk's layer count, k and the bytes of one expert."""
    chunks = (CHUNKS * 5)[:40] if batched else [1] * 80
    with Model(tiny_glm, LOAD) as m, Context(m, n_ctx=256, threads=2) as ctx:
        f = m.facts
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        ctx.enable_stats(ring_rows=0)
        table = replay.from_trace(CHAT, f.n_expert, f.n_expert_used)
        plan = SlotPlan.uniform(trunk, slots, f.n_expert, offset=5)
        c = _replayed(m, ctx, plan, tier, table, chunks, share=share)
        P = table.per_layer(trunk)[8:8 + sum(chunks)]
        core, first = masks(plan, tier, f.n_expert)
        return c, chunks, P, core, first, len(trunk), f.n_expert_used, f.slab_bytes


@pytest.mark.parametrize("slots,tier", [(8, 4), (12, 8), (8, 8)])
@pytest.mark.parametrize("batched", [False, True], ids=["one-token", "verify-batches"])
def test_the_simulator_predicts_the_fetch_tier(tiny_glm: Path, slots: int, tier: int, batched: bool) -> None:
    """The bundled chat trace replayed from position 8, one token at a time or in MTP-like verify batches of 1..8
    (those over the tier read it as it stands): core hits, tier hits, uploads and bytes equal the simulator's with
    the FETCH mechanism, and no miss is computed on the CPU in a stepped batch. (Checked: the same counts differ
    from the ENGINE mechanism's, which splits misses with the CPU.)"""
    c, chunks, P, core, first, L, k, slab = _chat_replay(tiny_glm, slots, tier, batched)
    n = sum(chunks)
    # the rule batch by batch; every decode batch is counted, those over the tier only read it (CPU misses)
    want = stepped_counts(Tier(core, tier, COST, initial=first, mech=FETCH), P, chunks, lambda b: True)
    read_only = stepped_counts(Tier(core, tier, COST, initial=first, mech=FETCH), P, chunks,
                               lambda b: b * k > tier)
    assert c.layer_tokens == n * L
    assert (c.core_hits, c.tier_hits, c.uploads, c.cpu) == tuple(want.tolist())
    assert c.uploads > 10 and c.bytes == c.uploads * slab
    assert c.cpu == int(read_only[3]) and (c.cpu > 0) == any(b * k > tier for b in chunks)
    if not batched:
        sim = simulate_hybrid(P, core, tier, COST, initial=first, mech=FETCH)
        assert c.uploads == round(sim.sync_uploads_per_token * n) and sim.cpu_picks_per_token == 0
        host = simulate_hybrid(P, core, tier, COST, initial=first, mech=ENGINE)
        assert round(host.sync_uploads_per_token * n) != c.uploads


@pytest.mark.parametrize("slots,tier", [(8, 4), (12, 8)])
@pytest.mark.parametrize("batched", [False, True], ids=["one-token", "verify-batches"])
def test_the_simulator_predicts_the_fetch_split(tiny_glm: Path, slots: int, tier: int, batched: bool) -> None:
    """With a CPU share (`--policy fetch-split`) the same replay: the engine's core hits, tier hits, uploads, CPU
    misses and bytes equal the simulator's with the FETCH_SPLIT mechanism, batch by batch; stepped batches leave
    misses to the CPU (checked: the counts differ from FETCH's, which copies them all)."""
    c, chunks, P, core, first, L, k, slab = _chat_replay(tiny_glm, slots, tier, batched, share=True)
    n = sum(chunks)
    want = stepped_counts(Tier(core, tier, SHARE, initial=first, mech=FETCH_SPLIT), P, chunks, lambda b: True)
    every = stepped_counts(Tier(core, tier, SHARE, initial=first, mech=FETCH), P, chunks, lambda b: True)
    stepped_cpu = int(want[3]) - int(stepped_counts(Tier(core, tier, SHARE, initial=first, mech=FETCH_SPLIT), P,
                                                    chunks, lambda b: b * k > tier)[3])
    assert c.layer_tokens == n * L
    assert (c.core_hits, c.tier_hits, c.uploads, c.cpu) == tuple(want.tolist())
    assert c.bytes == c.uploads * slab and c.uploads > 10
    assert tuple(want.tolist()) != tuple(every.tolist())
    assert c.cpu > 0 and stepped_cpu > 0


def test_the_fetch_tier_owns_its_slots(tiny_glm: Path) -> None:
    """While a fetch tier is on, swaps are refused; a tier larger than a layer's slots is refused and changes
    nothing; residents start as the plan's last slots; off again, swaps work."""
    with Model(tiny_glm, LOAD) as m:
        f = m.facts
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        plan = SlotPlan.uniform(trunk, 6, f.n_expert)
        m.set_slots(plan, pack_host=PACK_HOST)
        with pytest.raises(CacheError):
            native_tier.set_tier(m.ptr, 7, None, device=True)
        assert native_tier.set_tier(m.ptr, 4, None, device=True) == len(trunk)
        with pytest.raises(CacheError):
            swap(m.ptr, trunk[0], 0, 12)
        assert native_tier.residents(m.ptr, trunk[0], 4) == plan.slots_of(trunk[0])[2:]
        assert native_tier.read_counts(m.ptr) == native_tier.TierCounts()
        native_tier.set_tier(m.ptr, 0, None, device=True)
        assert swap(m.ptr, trunk[0], 0, 12) > 0


def test_fetch_needs_pinned_experts_at_the_command_line(tiny_glm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench repick --policy fetch` on mmap'ed experts: one clear line, no traceback."""
    from moeslots.cli.main import main

    rc = main(["bench", "repick", str(tiny_glm), "--policy", "fetch", "--slots", "6"])
    err = capsys.readouterr().err
    assert rc != 0 and "pinned host memory" in err and "Traceback" not in err


def test_a_freed_owner_hands_the_fetch_tier_over(tiny_glm: Path) -> None:
    """The context that stepped the tier is freed: the next context steps it (before, the owner stayed the freed
    context, and every later one computed the tiered layers' experts in host memory)."""
    with Model(tiny_glm, LOAD) as m:
        f = m.facts
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        plan = SlotPlan.uniform(trunk, 8, f.n_expert)
        m.set_slots(plan, pack_host=PACK_HOST)
        t = native_tier.NativeTier(m.ptr, plan, 4, COST, device=True)
        toks = _tokens(m.n_vocab, 12, 2)
        stepped = []
        try:
            for _ in range(2):
                with Context(m, n_ctx=64, threads=2) as ctx:
                    ctx.decode(toks[:8], prompt=True)
                    for tok in toks[8:12]:
                        ctx.decode([tok])
                t.step(0, force=True)
                stepped.append(t.counts.layer_tokens)
        finally:
            t.close()
        assert stepped == [4 * len(trunk), 8 * len(trunk)]


def test_stats_count_each_batch_once_and_where_it_was_served(tiny_glm: Path) -> None:
    """A stepped one-token decode, then an 8-token batch that only reads the tier (k * 8 > the tier): the routing
    stats count the batch's picks once (before, the stepped token's ids, left on the device, were counted again), and
    its hits are the picks resident in the slots the device left (the host map is not kept while the tier moves)."""
    with Model(tiny_glm, LOAD) as m, Context(m, n_ctx=128, threads=2) as ctx:
        f = m.facts
        k = f.n_expert_used
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        plan = SlotPlan.uniform(trunk, 8, f.n_expert)
        m.set_slots(plan, pack_host=PACK_HOST)
        ctx.enable_stats(ring_rows=1024)
        toks = _tokens(m.n_vocab, 40, 2)
        t = native_tier.NativeTier(m.ptr, plan, 4, COST, device=True)
        try:
            ctx.decode(toks[:8], prompt=True)
            for tok in toks[8:20]:
                ctx.decode([tok])                                   # stepped
            slots = {il: set(plan.slots_of(il)[:4]) | set(native_tier.residents(m.ptr, il, 4)) for il in trunk}
            before = ctx.read_stats()
            ctx.decode(toks[20:28], all_logits=True)                # read only
            after = ctx.read_stats()
        finally:
            t.close()
        picks = (after.picks_decode.astype(np.int64) - before.picks_decode.astype(np.int64)).reshape(-1, f.n_expert)
        assert all(int(picks[il].sum()) == 8 * k for il in trunk)
        rows = [r for r in after.ring if 20 <= int(r[0]) < 28]
        assert len(rows) == 8 * len(trunk)
        want = {il: sum(int(e) in slots[il] for r in rows if int(r[1]) == il for e in r[2:]) for il in trunk}
        got = {il: int(after.hits[il] - before.hits[il]) for il in trunk}
        assert got == want and 0 < sum(want.values()) < 8 * k * len(trunk)


def test_a_decode_that_failed_in_a_take_says_where(tiny_qwen: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After fetch-split decodes that ran (every take answered), no layer is named as failed: the failed word
    matches only the request a take gave up on. A failed decode whose take gave up (the engine names the layer; on
    the CPU the device always answers, so the failure and the name are faked here) says so, and the context waits for
    the device's queued work before its next decode; any other failure gives its code and waits for nothing. The
    take's own timeout is tested by the op test (moe_fetch_op.cpp)."""
    with Model(tiny_qwen, LOAD) as m, Context(m, n_ctx=256, threads=2) as ctx:
        f = m.facts
        plan = SlotPlan.uniform(f.moe_layers, 12, f.n_expert)
        m.set_slots(plan, pack_host=PACK_HOST)
        t = native_tier.NativeTier(m.ptr, plan, 8, SHARE, device=True, share=True)
        try:
            _script(ctx)
            assert native_tier.take_failed(m.ptr) is None
        finally:
            t.close()
        assert native_tier.take_failure(m.ptr) is None                  # another failure: its code is said
        # a decode that fails in a take: the reason, and the device's queued work waited for before the next decode
        # (a late publish of the failed one must not feed it); any other failure: its code, and no wait
        L = m._L
        real_decode, real_sync = L.llama_decode, L.llama_synchronize
        synced: list[int] = []
        monkeypatch.setattr(L, "llama_synchronize", lambda ptr: synced.append(1) or real_sync(ptr))
        monkeypatch.setattr(L, "llama_decode", lambda ptr, b: -3)
        with pytest.raises(EngineError, match="llama_decode failed with code -3"):
            ctx.decode([1])
        assert not ctx.sync_first
        monkeypatch.setattr(native_tier, "take_failed", lambda ptr: 5)
        with pytest.raises(EngineError, match="layer 5's inputs .* within 60 s \\(--policy fetch-split\\)"):
            ctx.decode([1])
        assert ctx.sync_first and not synced
        monkeypatch.setattr(L, "llama_decode", real_decode)
        ctx.decode([1])
        assert synced == [1] and not ctx.sync_first
        ctx.decode([2])
        assert synced == [1]


def _idle_cpu_s(seconds: float = 1.0) -> float:
    """The process's CPU time over `seconds` of doing nothing, after a short settle (the CPU backend's workers poll
    briefly after a graph, then sleep)."""
    time.sleep(0.2)
    t0 = time.process_time()
    time.sleep(seconds)
    return time.process_time() - t0


def test_no_thread_spins_after_a_fetch_split_tier_ends(tiny_glm: Path) -> None:
    """What a tier could leave behind that slows the static decode after it (issue: static after the tier rows): no
    thread keeps running once a fetch-split tier (its take spins while it waits for the device) has ended. The
    process idles at (nearly) no CPU time after it, as after static decodes: a thread left spinning would burn a
    share of a core even on a busy 2-core box (checked: a spinning thread started here reads 0.3-1.0 s)."""
    with Model(tiny_glm, LOAD) as m, Context(m, n_ctx=256, threads=2) as ctx:
        f = m.facts
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        ctx.enable_stats(ring_rows=0)
        table = replay.from_trace(CHAT, f.n_expert, f.n_expert_used)
        plan = SlotPlan.uniform(trunk, 12, f.n_expert, offset=5)
        m.set_slots(plan, pack_host=PACK_HOST)
        replay.set_replay(ctx.ptr, table)
        toks = _tokens(m.n_vocab, 48, 2)
        ctx.decode(toks[:8], prompt=True)
        for t in toks[8:16]:
            ctx.decode([t])
        before = _idle_cpu_s()
        c = _replayed(m, ctx, plan, 8, table, [1] * 24, share=True)
        assert c.cpu > 0 and c.uploads > 0                  # the share ran, and so did its take
        after = _idle_cpu_s()
    assert after < 0.1 and before < 0.1, (before, after)
