"""Native routing stats: counts equal the router's picks as traced through cb_eval, prompt and decode apart;
hits + misses = decode picks and hits are exactly the picks of resident experts; the ring holds the recent
rows in order; stats never change the logits."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.native import lib as native
from moeslots.engine.native import routing_stats as stats_mod
from moeslots.engine.native.evaltrace import RouterTracer
from moeslots.engine.native.expert_cache import SlotPlan


def _run(m: Model, ctx: Context, prompt: list[int], steps: list[int]) -> None:
    ctx.reset()
    ctx.decode(prompt, all_logits=True, prompt=True)     # all rows output: the last layer routes every row
    for t in steps:
        ctx.decode([t])


@pytest.mark.parametrize("full", [False, True])
def test_counts_match_the_traced_router(tiny_glm: Path, full: bool) -> None:
    """full: every expert resident, so the ids are counted from the pack's device after the graph ran, not by the
    op in the host chain's split (there is no host chain)."""
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        f = m.facts
        plan = SlotPlan.uniform(f.moe_layers[:-1], f.n_expert if full else 5, f.n_expert, offset=2)   # trunk layers
        m.set_slots(plan, pack_host=True)
        tracer = RouterTracer()
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(0, 300, 12)]
        steps = [int(t) for t in rng.integers(0, 300, 20)]
        with Context(m, n_ctx=128, threads=2, cb_eval=tracer.callback) as ctx:
            ctx.enable_stats(ring_rows=64)
            _run(m, ctx, prompt, steps)
            st = ctx.read_stats()
        # the tracer saw the prompt batch first (one record per layer), then one record per layer per step
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        per_layer: dict[int, list[np.ndarray]] = {il: [] for il in trunk}
        for il, ids in tracer.records:
            per_layer[il].append(ids)
        for il in trunk:
            prompt_ids, decode_ids = per_layer[il][0], np.concatenate(per_layer[il][1:])
            assert prompt_ids.shape[0] == len(prompt) and decode_ids.shape[0] == len(steps)
            assert np.array_equal(st.picks_prompt[il], np.bincount(prompt_ids.ravel(), minlength=f.n_expert))
            assert np.array_equal(st.picks_decode[il], np.bincount(decode_ids.ravel(), minlength=f.n_expert))
            resident = np.isin(decode_ids, plan.slots_of(il))
            assert int(st.hits[il]) == int(resident.sum())
            assert int(st.misses[il]) == int((~resident).sum())
            assert int(st.hits[il] + st.misses[il]) == int(st.picks_decode[il].sum())
        assert st.picks_prompt[0].sum() == 0 and st.picks_decode[0].sum() == 0      # dense layer
        assert st.hit_rate == 1.0 if full else 0 < st.hit_rate < 1
        # ring: the last 64 rows are the last decode steps, layer by layer, with their positions
        assert st.ring.shape == (64, 2 + f.n_expert_used)
        last = st.ring[-len(trunk):]
        assert list(last[:, 0]) == [len(prompt) + len(steps) - 1] * len(trunk)
        assert list(last[:, 1]) == trunk
        for row, il in zip(last, trunk):
            assert np.array_equal(row[2:], per_layer[il][-1][0])
        assert stats_mod.weight_copy_bytes() == 0      # CPU: nothing ever crosses to another backend


def test_prompt_rows_are_negative_in_the_ring(tiny_qwen: Path) -> None:
    with Model(tiny_qwen) as m, Context(m, n_ctx=128, threads=2) as ctx:
        ctx.enable_stats(ring_rows=1000)
        ctx.decode([1, 2, 3, 4], all_logits=True, prompt=True)
        st = ctx.read_stats()
        pos = sorted({int(p) for p in st.ring[:, 0]})
        assert pos == [-4, -3, -2, -1]                 # positions 0..3 as -pos-1
        ctx.reset()
        ctx.read_stats()
        from moeslots.engine.native import routing_stats as stats

        stats.reset(ctx.ptr)
        assert ctx.read_stats().picks_prompt.sum() == 0 and len(ctx.read_stats().ring) == 0


def test_stats_do_not_change_logits(tiny_qwen: Path) -> None:
    toks = list(range(10, 30))
    out = []
    for on in (False, True):
        with Model(tiny_qwen) as m, Context(m, n_ctx=128, threads=2) as ctx:
            if on:
                ctx.enable_stats()
            ctx.decode(toks[:5], prompt=True)
            rows = [ctx.logits().copy()]
            for t in toks[5:]:
                ctx.decode([t])
                rows.append(ctx.logits().copy())
            out.append(np.stack(rows))
    assert np.array_equal(out[0], out[1])


def test_fully_resident_layers_keep_their_ids_on_the_device(tiny_qwen: Path) -> None:
    """With stats on, a fully resident layer copies its ids into a buffer beside the pack (a node named
    moe_stats_ids-<layer>) and runs no stats op; a partly resident layer runs the op. Counts are those of the
    router either way."""
    seen: set[str] = set()

    def cb(tp: int, ask: bool, _ud: object) -> bool:
        name = ctypes.string_at(tp + native.TENSOR_NAME_OFFSET).decode()
        if ask:
            return name.startswith("moe_stats_ids-")
        seen.add(name.split(" ")[0])
        return True

    callback = native.llama().ggml_backend_sched_eval_callback(cb)
    with Model(tiny_qwen) as m:
        f = m.facts
        full, part = f.moe_layers[0], f.moe_layers[1]
        m.set_slots(SlotPlan({full: tuple(range(f.n_expert)), part: (0, 1, 2)}), pack_host=True)
        with Context(m, n_ctx=128, threads=2, cb_eval=callback) as ctx:
            ctx.enable_stats(ring_rows=16)
            ctx.decode([5, 6, 7, 8], all_logits=True, prompt=True)   # (all rows: the last layer routes them all)
            ctx.decode([9])
            st = ctx.read_stats()
    assert seen == {f"moe_stats_ids-{full}"}
    assert st.picks_prompt[full].sum() == 4 * f.n_expert_used == st.picks_prompt[part].sum()
    assert st.hits[full] == f.n_expert_used and st.misses[full] == 0
    assert st.hits[part] + st.misses[part] == f.n_expert_used


def test_scheduler_clock_counts_graphs_and_splits(tiny_glm: Path) -> None:
    """Patch 0006: while on, every computed graph and its splits are counted and the CPU's compute time is summed;
    off, nothing accumulates; a reset zeroes the sums. (On this CPU-only machine every split is the CPU's.)"""
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m, Context(m, n_ctx=128, threads=2) as ctx:
        m.set_slots(SlotPlan.uniform(m.facts.moe_layers[:-1], 5, m.facts.n_expert), pack_host=True)
        ctx.decode([1, 2, 3, 4], prompt=True)
        stats_mod.sched_timing(False, reset=True)
        for t in (5, 6, 7):
            ctx.decode([t])
        off = stats_mod.sched_timing(True, reset=True)
        assert off is not None and off.graphs == 0 and off.cpu_compute_us == 0
        for t in (8, 9, 10, 11, 12):
            ctx.decode([t])
        on = stats_mod.sched_timing(False, reset=True)
        assert on is not None and on.graphs == 5
        assert on.cpu_splits >= 5 and on.gpu_splits == 0
        assert on.cpu_compute_us > 0 and on.gpu_launch_us == 0
        assert stats_mod.sched_timing(False).graphs == 0      # the reset above
        per = on.per_graph_ms()
        assert per["cpu_splits"] == on.cpu_splits / 5 and abs(per["cpu_compute_ms"] - on.cpu_compute_us / 5000) < 1e-12


def test_warm_up_graphs_do_not_fill_the_ring(tiny_qwen: Path) -> None:
    """A warm-up decode (llama_set_warmup: the graph picks every expert) counts its picks but writes no ring row,
    on a partly resident layer (the host chain's flat ids) as on the others; the next decode writes one row per MoE
    layer and token, k ids each. (Checked: counting the flat ids with the model's k turned the warm-up row into
    n_expert / k misgrouped ring rows.)"""
    from moeslots.engine.native import lib as native

    with Model(tiny_qwen, LoadOptions(extra_bufts=False)) as m:
        f = m.facts
        m.set_slots(SlotPlan({il: (0, 1, 2) for il in f.moe_layers}), pack_host=True)
        with Context(m, n_ctx=128, threads=2) as ctx:
            ctx.enable_stats(ring_rows=256)
            ctx.decode([5, 6, 7, 8], prompt=True)
            before = len(ctx.read_stats().ring)
            native.llama().llama_set_warmup(ctx.ptr, True)
            ctx.decode([9])
            native.llama().llama_set_warmup(ctx.ptr, False)
            warm = ctx.read_stats()
            ctx.decode([10, 11])                                # (a new graph: the warm-up one is not reused)
            ctx.decode([12])
            st = ctx.read_stats()
    assert len(warm.ring) == before
    assert all(warm.picks_decode[il].sum() == f.n_expert for il in f.moe_layers)
    rows = {il: 3 for il in f.moe_layers} | {f.moe_layers[-1]: 2}   # the last layer routes the output rows only
    assert sorted(st.ring[before:, 1].tolist()) == sorted(il for il, n in rows.items() for _ in range(n))
    assert all(st.picks_decode[il].sum() == f.n_expert + n * f.n_expert_used for il, n in rows.items())
