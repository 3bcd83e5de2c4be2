"""Native routing stats: counts equal the router's picks as traced through cb_eval, prompt and decode apart;
hits + misses = decode picks and hits are exactly the picks of resident experts; the ring holds the recent
rows in order; stats never change the logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moeslots.engine import stats as stats_mod
from moeslots.engine.cache import SlotPlan
from moeslots.engine.model import Context, LoadOptions, Model
from moeslots.engine.trace import RouterTracer


def _run(m: Model, ctx: Context, prompt: list[int], steps: list[int]) -> None:
    ctx.reset()
    ctx.decode(prompt, all_logits=True, prompt=True)     # all rows output: the last layer routes every row
    for t in steps:
        ctx.decode([t])


def test_counts_match_the_traced_router(tiny_glm: Path) -> None:
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        f = m.facts
        plan = SlotPlan.uniform(f.moe_layers[:-1], 5, f.n_expert, offset=2)   # trunk MoE layers
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
        assert 0 < st.hit_rate < 1
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
        from moeslots.engine import stats

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
