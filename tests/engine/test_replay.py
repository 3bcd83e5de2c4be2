"""Routing replay: the router's choice is replaced by the table (stats count exactly the table), the cache stays
bit-exact under replay, turning it off restores the router, and traces map onto the model's experts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moeslots.engine.errors import EngineError
from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.native import replay
from moeslots.engine.native.expert_cache import SlotPlan


def _decode(ctx: Context, toks: list[int]) -> list[np.ndarray]:
    ctx.reset()
    ctx.decode(toks[:6], all_logits=True, prompt=True)
    out = [ctx.logits(i).copy() for i in range(6)]
    for t in toks[6:]:
        ctx.decode([t])
        out.append(ctx.logits().copy())
    return out


def test_replay_replaces_the_router(tiny_qwen: Path) -> None:
    with Model(tiny_qwen, LoadOptions(extra_bufts=False)) as m, Context(m, n_ctx=128, threads=2) as ctx:
        f = m.facts
        table = replay.uniform(7, 2, f.n_expert, f.n_expert_used, seed=3)
        toks = list(range(20, 40))
        natural = _decode(ctx, toks)
        ctx.enable_stats(ring_rows=100)
        replay.set_replay(ctx.ptr, table)
        replayed = _decode(ctx, toks)
        st = ctx.read_stats()
        assert not all(np.array_equal(a, b) for a, b in zip(natural, replayed))
        for il in (0, 1):
            want_prompt = np.bincount(table.ids[np.arange(6) % 7, il].ravel(), minlength=f.n_expert)
            want_decode = np.bincount(table.ids[np.arange(6, 20) % 7, il].ravel(), minlength=f.n_expert)
            assert np.array_equal(st.picks_prompt[il], want_prompt)
            assert np.array_equal(st.picks_decode[il], want_decode)
        last = st.ring[-1]
        assert last[0] == 19 and last[1] == 1 and np.array_equal(last[2:], table.ids[19 % 7, 1])
        # the cache is exact under replay too
        m.set_slots(SlotPlan.uniform([0, 1], 6, f.n_expert), pack_host=True)
        cached = _decode(ctx, toks)
        assert all(np.array_equal(a, b) for a, b in zip(replayed, cached))
        replay.set_replay(ctx.ptr, None)
        m.set_slots(SlotPlan({}), pack_host=True)
        assert all(np.array_equal(a, b) for a, b in zip(natural, _decode(ctx, toks)))


def test_trace_is_mapped_onto_the_model(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("# arch=glm4moe n_expert=64 k=4\npos,layer,id0,id1,id2,id3\n"
                 "-1,1,0,1,2,3\n0,1,0,8,16,63\n0,2,4,5,6,7\n1,1,60,61,62,63\n1,2,1,2,3,4\n")
    t = replay.from_trace(p, n_expert=16, k=4)
    assert t.ids.shape == (2, 2, 4)
    assert t.ids[0, 0].tolist() == [0, 2, 4, 15] and t.ids[1, 0].tolist() == [15, 15, 15, 15]
    assert "64 experts mapped onto 16" in t.source
    split = replay.from_trace(p, n_expert=128, k=8)          # k 4 -> 8: each expert becomes a pair
    assert split.ids[0, 0].tolist() == [0, 1, 16, 17, 32, 33, 126, 127]
    assert split.ids[1, 1].tolist() == [2, 3, 4, 5, 6, 7, 8, 9] and "split into 2 of 128" in split.source
    with pytest.raises(EngineError, match="multiple of 4"):
        replay.from_trace(p, n_expert=128, k=6)


def test_bad_replay_is_refused(tiny_qwen: Path, tmp_path: Path) -> None:
    with Model(tiny_qwen) as m, Context(m, n_ctx=64, threads=2) as ctx:
        bad = replay.ReplayTable(np.full((3, 2, 4), 99, np.int32), "bad")
        with pytest.raises(EngineError, match="replay refused"):
            replay.set_replay(ctx.ptr, bad)
        ctx.decode([1, 2, 3])                                     # still usable
    empty = tmp_path / "e.csv"
    empty.write_text("pos,layer,id0\n-1,0,3\n")
    with pytest.raises(EngineError, match="no decode rows"):
        replay.from_trace(empty, 16, 1)


def test_a_freed_context_leaves_no_stats_or_replay_behind(tiny_qwen: Path) -> None:
    """Stats and replay tables are keyed by the context's address; a later context at the same address (malloc
    reuses it at once) must start clean. It used to inherit them: a replay table of a 64-expert model then fed
    ids out of range to a 32-expert model's get_rows (an abort that depended on test order)."""
    from moeslots.engine.native import routing_stats as stats

    toks = list(range(30, 42))
    with Model(tiny_qwen, LoadOptions(extra_bufts=False)) as m:
        f = m.facts
        gone = Context(m, n_ctx=64, threads=2)
        addr = gone.ptr
        gone.enable_stats(ring_rows=16)
        gone.close()
        with pytest.raises(EngineError, match="stats are off"):   # the registry forgot it (the key only is used)
            stats.read(addr, m.n_layer_all, f.n_expert, f.n_expert_used, 16)
        with Context(m, n_ctx=64, threads=2) as ref:
            natural = _decode(ref, toks)
        for _ in range(20):                                       # and a context that reuses the address
            a = Context(m, n_ctx=64, threads=2)
            addr = a.ptr
            a.enable_stats(ring_rows=16)
            replay.set_replay(a.ptr, replay.uniform(5, 2, f.n_expert, f.n_expert_used, seed=1))
            a.close()
            b = Context(m, n_ctx=64, threads=2)
            try:
                if b.ptr != addr:
                    continue
                with pytest.raises(EngineError, match="stats are off"):
                    stats.read(b.ptr, m.n_layer_all, f.n_expert, f.n_expert_used, 16)
                got = _decode(b, toks)
                assert all(np.array_equal(x, y) for x, y in zip(natural, got))      # the router, not a replay
                break
            finally:
                b.close()
