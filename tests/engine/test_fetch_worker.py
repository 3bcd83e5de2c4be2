"""The CPU share of a GPU-stepped tier computed by a worker outside the graph (patch 0010, `NativeTier(...,
worker=N)`): the fetch node publishes the stage as before, the model's worker computes each layer's host chain from
it into the layer's answer, and the layer's join node (GGML_OP_MOE_FETCH_JOIN) waits for that answer in the device's
queue and adds it. Here the pack is in host memory (the CPU is the device): the worker's result must be the graph
split's to the bit, its counts and routing stats the same, and nothing may keep running once the tier has ended."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_fetch_tier import COST, LOAD, SHARE, _idle_cpu_s
from test_native_tier import CHUNKS, PACK_HOST, _same, _script

from moeslots.engine.llm.model import Context, Model
from moeslots.engine.native import tier as native_tier
from moeslots.engine.native.expert_cache import CacheError, SlotPlan


def _run(m: Model, ctx: Context, plan: SlotPlan, tier: int, worker: int
         ) -> tuple[list[np.ndarray], native_tier.TierCounts, np.ndarray, np.ndarray, int | None]:
    """The script through a fetch-split tier (worker threads, 0: the graph's split): logits, the tier's counts, the
    routing stats' decode picks and hits, and the worker's layer shares."""
    m.set_slots(plan, pack_host=PACK_HOST)
    ctx.enable_stats(ring_rows=0)
    t = native_tier.NativeTier(m.ptr, plan, tier, SHARE, device=True, share=True, worker=worker)
    try:
        got = _script(ctx)
        t.step(force=True)
        w = native_tier.worker_stats(m.ptr)
        shares = w.shares if w is not None else None
        s = ctx.read_stats()
    finally:
        t.close()
    return got, t.counts, s.picks_decode.copy(), s.hits.copy(), shares


@pytest.mark.parametrize("slots,tier", [(12, 8), (12, 12)])       # a core + tier, all slots a tier
def test_the_worker_computes_the_share_the_graph_split_does(tiny_qwen: Path, slots: int, tier: int) -> None:
    """Stock, the graph's split and the worker over the same script (a prompt, decode batches of 1..8): the same
    logits, bit for bit on the CPU; the same tier counts and routing stats; and the worker computed every stepped
    layer's share (checked: with the answer's share left out of the join, or the host plane read from the picks
    plane, the worker's rows differ)."""
    with Model(tiny_qwen, LOAD) as m, Context(m, n_ctx=256, threads=2) as ctx:
        f = m.facts
        ctx.enable_stats(ring_rows=0)
        stock = _script(ctx)
        plan = SlotPlan.uniform(f.moe_layers, slots, f.n_expert)
        split, c_split, picks_split, hits_split, none = _run(m, ctx, plan, tier, 0)
        work, c_work, picks_work, hits_work, shares = _run(m, ctx, plan, tier, 2)
    assert none is None
    _same(stock, split, "fetch-split, the graph's split")
    _same(stock, work, "fetch-split, the worker")
    assert c_work == c_split and c_work.cpu > 0 and c_work.uploads > 0
    assert np.array_equal(picks_work, picks_split) and np.array_equal(hits_work, hits_split)
    # every batch whose picks fit in the tier (k * n <= tier) is stepped: one share a layer
    stepped = sum(1 for n in CHUNKS if n * f.n_expert_used <= tier)
    assert shares == stepped * len(f.moe_layers)


def test_a_worker_needs_a_tier_with_a_cpu_share(tiny_qwen: Path) -> None:
    """Refused in one line, and nothing changes: no tier, a tier without a CPU share, a bad thread count; the tier
    that was there keeps stepping."""
    with Model(tiny_qwen, LOAD) as m, Context(m, n_ctx=256, threads=2) as ctx:
        f = m.facts
        plan = SlotPlan.uniform(f.moe_layers, 12, f.n_expert)
        m.set_slots(plan, pack_host=PACK_HOST)
        with pytest.raises(CacheError, match="no tier with a CPU share"):
            native_tier.set_worker(m.ptr, 2)
        with pytest.raises(CacheError, match="has no CPU share on its pack's device"):
            native_tier.NativeTier(m.ptr, plan, 8, COST, device=True, worker=2)
        assert native_tier.worker_stats(m.ptr) is None
        t = native_tier.NativeTier(m.ptr, plan, 8, SHARE, device=True, share=True)
        try:
            with pytest.raises(CacheError, match="invalid arguments"):
                native_tier.set_worker(m.ptr, -1)
            _script(ctx)
            t.step(force=True)
            assert t.counts.cpu > 0 and native_tier.worker_stats(m.ptr) is None
        finally:
            t.close()


def test_no_thread_spins_after_a_worker_s_tier_ends(tiny_qwen: Path) -> None:
    """The worker's thread sleeps between tokens and its pool's threads poll only briefly: once its tier has ended
    and the next graph is built without it, the process idles at (nearly) no CPU time."""
    with Model(tiny_qwen, LOAD) as m, Context(m, n_ctx=256, threads=2) as ctx:
        f = m.facts
        plan = SlotPlan.uniform(f.moe_layers, 12, f.n_expert)
        m.set_slots(plan, pack_host=PACK_HOST)
        t = native_tier.NativeTier(m.ptr, plan, 8, SHARE, device=True, share=True, worker=1)
        try:
            _script(ctx)
            between = _idle_cpu_s()                  # the worker alive, between tokens
        finally:
            t.close()
        ctx.decode([3])                              # a graph without the worker: the last one frees it
        after = _idle_cpu_s()
    assert between < 0.1 and after < 0.1, (between, after)
