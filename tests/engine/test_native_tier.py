"""The engine's own dynamic tier (patch 0007, engine.native_tier): uploads now into the tier's slots, decided inside
the graph per layer and token. It never changes the output (bit-identical logits to the stock run for prompts, one-
token decodes and multi-token batches, hybrid and dynamic), and the simulator (profiles.hybrid with the NATIVE
mechanism) predicts its hits, uploads and CPU misses exactly on replayed routing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from exactness import _tokens, assert_identical, run_script

from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.native import replay
from moeslots.engine.native import routing_stats as stats_mod
from moeslots.engine.native import tier as native_tier
from moeslots.engine.native.expert_cache import CacheError, SlotPlan, swap
from moeslots.engine.native.tier import masks
from moeslots.profiles.costs import CostModel
from moeslots.profiles.hybrid import NATIVE, NATIVE_GPU_PACK, Tier, simulate_hybrid

ROOT = Path(__file__).resolve().parents[2]
CHAT = ROOT / "profiles/data/moeslots-tiny-glm4moe-chat.csv"
EVEN = CostModel(slab_mb=1.0, cpu_gbps=1.0, pcie_gbps=1.0, gpu_gbps=1000.0, base_ms=1.0)      # half the misses go up
CHEAP = CostModel(slab_mb=1.0, cpu_gbps=1.0, pcie_gbps=1e3, gpu_gbps=1000.0, base_ms=1.0)     # every miss goes up
DEAR = CostModel(slab_mb=1.0, cpu_gbps=10.0, pcie_gbps=1e-6, gpu_gbps=1000.0, base_ms=0.0)    # none does
# uploads from pageable memory add to the CPU's work: all that fit go up when one costs less than a CPU expert...
SERIAL_UP = CostModel(slab_mb=1.0, cpu_gbps=1.0, pcie_gbps=2.0, gpu_gbps=1000.0, base_ms=1.0, serial_uploads=True)
# ...and none when it costs more (where EVEN's overlapped split sends half)
SERIAL_NONE = CostModel(slab_mb=1.0, cpu_gbps=1.0, pcie_gbps=0.9, gpu_gbps=1000.0, base_ms=1.0, serial_uploads=True)
CHUNKS = [1, 2, 1, 1, 3, 1, 1, 1, 5, 1, 1, 1, 8, 1, 1, 1]
# MOESLOTS_TEST_PACK=gpu (a CUDA engine): the pack and the tier's uploads on the GPU. Placement counts must then
# still equal the simulator's; logits agree with stock to GPU rounding (the GPU computes the slots' experts), not bits.
ON_GPU = os.environ.get("MOESLOTS_TEST_PACK", "host") == "gpu"
PACK_HOST = not ON_GPU


def stepped_counts(rule: Tier, P: np.ndarray, sizes: list[int], steps: "Callable[[int], bool]") -> np.ndarray:
    """The rule run over P [T, L, k] in batches of `sizes`: core hits, tier hits, uploads and CPU misses summed over
    the batches steps(n) selects (the engine counts every decode batch, those that only read the tier too)."""
    want = np.zeros(4, np.int64)
    for t0, b in zip(np.cumsum([0] + sizes[:-1]).tolist(), sizes):
        st = rule.step(P[t0]) if b == 1 else rule.step_batch(P[t0:t0 + b])
        if steps(b):
            want += [st.core_hits, st.tier_hits, len(st.uploads_now), st.cpu]
    return want


def _same(stock: list[np.ndarray], got: list[np.ndarray], what: str) -> None:
    if not ON_GPU:
        assert_identical(stock, got, what)
        return
    for i, (x, y) in enumerate(zip(stock, got)):
        rel = float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30))
        assert rel < 2e-2, f"{what}: row {i} differs by {rel:.3g} of its scale on the GPU"


def _script(ctx: Context) -> list[np.ndarray]:
    """A prompt, then decode batches of 1..8 tokens (each steps the tier, as MTP verify batches do); every row's
    logits."""
    return run_script(ctx, 0, prompt_len=20, chunks=CHUNKS)


@pytest.mark.parametrize("tier", [2, 6])                   # hybrid (4 core + 2 tier), dynamic (all 6)
def test_the_tier_keeps_logits_exact(tiny_qwen: Path, tier: int) -> None:
    with Model(tiny_qwen, LoadOptions(extra_bufts=False)) as m, Context(m, n_ctx=256, threads=2) as ctx:
        f = m.facts
        ctx.enable_stats(ring_rows=4096)
        stock = _script(ctx)
        plan = SlotPlan.uniform(f.moe_layers, 6, f.n_expert)
        m.set_slots(plan, pack_host=PACK_HOST)
        t = native_tier.NativeTier(m.ptr, plan, tier, EVEN)
        try:
            got = _script(ctx)
            t.step()
            c, now = t.counts, t.refresh()
        finally:
            t.close()
        _same(stock, got, f"tier of {tier}")
        # decode batches (1-8 tokens) are counted (with the pack on a GPU only one-token ones step it), not prompts
        assert c.layer_tokens == sum(CHUNKS) * len(f.moe_layers)
        assert c.uploads >= 5 and c.cpu > 0                          # EVEN: misses split both ways
        assert now != plan and all(now.slots_of(il)[:6 - tier] == plan.slots_of(il)[:6 - tier]
                                   for il in f.moe_layers)           # the core never moves
        assert all(len(set(now.slots_of(il))) == 6 for il in f.moe_layers)


def _replayed(m: Model, ctx: Context, plan: SlotPlan, tier: int, cost: CostModel, n: int,
              table: replay.ReplayTable) -> tuple[native_tier.TierCounts, "stats_mod.RoutingStats"]:
    m.set_slots(plan, pack_host=PACK_HOST)
    ctx.reset()
    replay.set_replay(ctx.ptr, table)
    toks = _tokens(m.n_vocab, 8 + n, 2)
    ctx.decode(toks[:8], prompt=True)
    stats_mod.reset(ctx.ptr)
    t = native_tier.NativeTier(m.ptr, plan, tier, cost)
    try:
        for tok in toks[8:]:
            ctx.decode([tok])
            t.step()
        return t.counts, ctx.read_stats()
    finally:
        t.close()


@pytest.mark.parametrize("cost", [EVEN, CHEAP, DEAR, SERIAL_UP, SERIAL_NONE],
                         ids=["even", "cheap", "dear", "serial-up", "serial-none"])
@pytest.mark.parametrize("slots,tier", [(8, 3), (8, 8)])
def test_the_simulator_predicts_the_engine(tiny_glm: Path, cost: CostModel, slots: int, tier: int) -> None:
    """The bundled chat trace replayed, positions 8.. decoded one token at a time: the engine's core hits, tier hits,
    uploads and CPU misses equal the simulator's (NATIVE: uploads now, no prefetch) on the same rows, core, first
    tier and costs; the native stats' hit rate too. (Checked: against the simulator with prefetches on, it fails.)"""
    n = 80
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m, Context(m, n_ctx=256, threads=2) as ctx:
        f = m.facts
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        ctx.enable_stats(ring_rows=0)
        table = replay.from_trace(CHAT, f.n_expert, f.n_expert_used)
        plan = SlotPlan.uniform(trunk, slots, f.n_expert, offset=5)
        c, st = _replayed(m, ctx, plan, tier, cost, n, table)
        P = table.per_layer(trunk)[8:8 + n]
        core, first = masks(plan, tier, f.n_expert)
        sim = simulate_hybrid(P, core, tier, cost, initial=first, mech=NATIVE)
        L, k = len(trunk), f.n_expert_used
        assert c.layer_tokens == n * L
        assert c.core_hits + c.tier_hits == round(sim.hit_rate * n * L * k)
        assert c.tier_hits == round(sim.tier_hit_rate * sim.hit_rate * n * L * k)
        assert c.uploads == round(sim.sync_uploads_per_token * n)
        assert c.cpu == round(sim.cpu_picks_per_token * n)
        assert st.hit_rate == pytest.approx(sim.hit_rate, abs=1e-12)
        if cost is DEAR or cost is SERIAL_NONE:
            assert c.uploads == 0 and c.bytes == 0
        else:
            assert c.uploads > 10 and c.bytes == c.uploads * f.slab_bytes
        if cost is SERIAL_UP:                           # every miss the tier has room for: none left beside one
            assert c.uploads > round(simulate_hybrid(P, core, tier, EVEN, initial=first, mech=NATIVE)
                                     .sync_uploads_per_token * n)


def test_the_tier_owns_its_slots(tiny_glm: Path) -> None:
    """While a tier is on, swaps are refused (the tier moves those slots); a tier larger than a layer's slots is
    refused and changes nothing; off again, swaps work."""
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        f = m.facts
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        plan = SlotPlan.uniform(trunk, 6, f.n_expert)
        m.set_slots(plan, pack_host=PACK_HOST)
        with pytest.raises(CacheError):
            native_tier.set_tier(m.ptr, 7, EVEN)
        assert native_tier.set_tier(m.ptr, 2, EVEN) == len(trunk)
        with pytest.raises(CacheError):
            swap(m.ptr, trunk[0], 0, 12)
        assert native_tier.residents(m.ptr, trunk[0], 2) == plan.slots_of(trunk[0])[4:]
        native_tier.set_tier(m.ptr, 0, None)
        assert swap(m.ptr, trunk[0], 0, 12) > 0


def test_a_tier_ended_while_a_graph_runs_leaves_consistent_maps(tiny_glm: Path) -> None:
    """The tier turned off in the middle of a one-token graph (here from the eval callback, right after the first
    tiered layer's route node: what F3 from the app's thread could do): the rest of that graph steps the rule no more,
    so the device map written at tier-off matches the host map, and the decodes after it stay bit-identical to stock.
    (Checked: when the later route nodes of that graph still step, the next tokens' logits differ.)"""
    import ctypes

    from moeslots.engine.native import lib as native

    fire = {"on": False, "ptr": 0, "done": 0}

    def cb(tp: int, ask: bool, _ud: object) -> bool:
        name = ctypes.string_at(tp + native.TENSOR_NAME_OFFSET).decode()
        if ask:
            return name.startswith("ffn_moe_tier_route-")
        if fire["on"]:
            fire["on"] = False
            native_tier.set_tier(fire["ptr"], 0, None)
            fire["done"] += 1
        return True

    callback = native.llama().ggml_backend_sched_eval_callback(cb)
    with (Model(tiny_glm, LoadOptions(extra_bufts=False)) as m,
          Context(m, n_ctx=256, threads=2, cb_eval=callback) as ctx):
        f = m.facts
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        toks = _tokens(m.n_vocab, 60, 3)

        def run() -> list[np.ndarray]:
            ctx.reset()
            ctx.decode(toks[:8], prompt=True)
            out = []
            for i, t in enumerate(toks[8:]):
                fire["on"] = tier_on and i == 12                   # token 12: the tier ends inside its graph
                ctx.decode([t])
                out.append(ctx.logits().copy())
            return out

        tier_on = False
        stock = run()
        plan = SlotPlan.uniform(trunk, 6, f.n_expert)
        m.set_slots(plan, pack_host=PACK_HOST)
        fire["ptr"] = m.ptr
        assert native_tier.set_tier(m.ptr, 6, CHEAP) == len(trunk)   # dynamic: every miss uploaded
        tier_on = True
        got = run()
    assert fire["done"] == 1
    _same(stock, got, "tier ended mid-graph")


def test_one_context_steps_the_tier(tiny_glm: Path) -> None:
    """Two contexts on one model: the first whose graphs are built with the tier (here: the first to decode, both
    being created before the tier) steps it; the other's graphs compute the
    tiered layers' experts in host memory (its logits are stock's, it moves nothing, it is not counted); once the
    first is freed, the other takes the tier over."""
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        f = m.facts
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        toks = _tokens(m.n_vocab, 24, 4)
        with Context(m, n_ctx=128, threads=2) as ref:
            ref.decode(toks[:8], prompt=True)
            want = []
            for t in toks[8:]:
                ref.decode([t])
                want.append(ref.logits().copy())
        m.set_slots(SlotPlan.uniform(trunk, 6, f.n_expert), pack_host=PACK_HOST)
        native_tier.set_tier(m.ptr, 6, CHEAP)
        a = Context(m, n_ctx=128, threads=2)
        try:
            with Context(m, n_ctx=128, threads=2) as b:
                a.decode(toks[:8], prompt=True)
                a.decode([toks[8]])
                stepped = native_tier.read_counts(m.ptr, reset=True)
                assert stepped.layer_tokens == len(trunk) and stepped.uploads > 0
                b.decode(toks[:8], prompt=True)
                got = []
                for t in toks[8:]:
                    b.decode([t])
                    got.append(b.logits().copy())
                assert native_tier.read_counts(m.ptr, reset=True).layer_tokens == 0     # b steps nothing
                _same(want, got, "the second context")
                a.close()
                b.decode([toks[9]])                                  # a is gone: b's next graphs step the tier
                assert native_tier.read_counts(m.ptr, reset=True).layer_tokens == len(trunk)
        finally:
            a.close()
            native_tier.set_tier(m.ptr, 0, None)


@pytest.mark.parametrize("cost", [EVEN, CHEAP], ids=["even", "cheap"])
def test_the_simulator_predicts_verify_batches(tiny_glm: Path, cost: CostModel) -> None:
    """Decode batches of 1-8 tokens with every row an output (as MTP verify batches are) on replayed routing: each
    steps the engine's tier once, and the simulator's batched step (batches=) predicts its core hits, tier hits,
    uploads and CPU misses exactly. (Checked: stepped token by token instead, the simulator's counts differ.)"""
    sizes = [1, 2, 3, 1, 5, 8, 1, 4, 2, 6, 1, 7, 3, 1, 8, 2]
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m, Context(m, n_ctx=256, threads=2) as ctx:
        f = m.facts
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        table = replay.from_trace(CHAT, f.n_expert, f.n_expert_used)
        plan = SlotPlan.uniform(trunk, 8, f.n_expert, offset=5)
        m.set_slots(plan, pack_host=PACK_HOST)
        ctx.reset()
        replay.set_replay(ctx.ptr, table)
        toks = _tokens(m.n_vocab, 9 + sum(sizes), 5)
        ctx.decode(toks[:9], prompt=True)                           # 9 rows, one output: no step
        t = native_tier.NativeTier(m.ptr, plan, 3, cost)
        try:
            pos = 9
            for n in sizes:
                ctx.decode(toks[pos:pos + n], all_logits=True)
                pos += n
            t.step()
            c = t.counts
        finally:
            t.close()
            replay.set_replay(ctx.ptr, None)
        P = table.per_layer(trunk)[9:9 + sum(sizes)]
        core, first = masks(plan, 3, f.n_expert)
        n, L, k = sum(sizes), len(trunk), f.n_expert_used
        if ON_GPU:       # a pack on a GPU: multi-token batches read the tier as it stands (engine/patches/README.md)
            rule = Tier(core, 3, cost, initial=first, mech=NATIVE_GPU_PACK)
            want = stepped_counts(rule, P, sizes, lambda b: True)      # batches of several tokens only read it
            assert c.layer_tokens == n * L
            assert (c.core_hits, c.tier_hits, c.uploads, c.cpu) == tuple(want.tolist()) and c.uploads > 0
            return
        sim = simulate_hybrid(P, core, 3, cost, initial=first, mech=NATIVE, batches=sizes)
        assert c.layer_tokens == n * L
        assert c.core_hits + c.tier_hits == round(sim.hit_rate * n * L * k)
        assert c.tier_hits == round(sim.tier_hit_rate * sim.hit_rate * n * L * k)
        assert (c.uploads, c.cpu) == (round(sim.sync_uploads_per_token * n), round(sim.cpu_picks_per_token * n))
        assert c.uploads > 5
        token_by_token = simulate_hybrid(P, core, 3, cost, initial=first, mech=NATIVE)
        assert (round(token_by_token.sync_uploads_per_token * n), round(token_by_token.cpu_picks_per_token * n)) != \
            (c.uploads, c.cpu)
