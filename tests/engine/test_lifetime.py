"""Lifetime and threads of the expert cache: the cache dies with its model, a slot rewrite never
finds a freed context, a stage racing a reconfigure or clear never writes into a freed pack, and every case leaves
the logits bit-identical to stock."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from exactness import _tokens, assert_identical

from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.native import expert_cache as cache
from moeslots.engine.native.expert_cache import CacheError, SlotPlan


def _trunk(m: Model) -> list[int]:
    return [il for il in m.facts.moe_layers if il < m.facts.n_layer]     # (the NextN block is not loaded)


def _script(ctx: Context, seed: int = 1) -> list[np.ndarray]:
    toks = _tokens(ctx.model.n_vocab, 24, seed)
    ctx.reset()
    ctx.decode(toks[:16], all_logits=True)
    out = [ctx.logits(i).copy() for i in range(16)]
    for t in toks[16:]:
        ctx.decode([t])
        out.append(ctx.logits().copy())
    return out


def test_freeing_a_model_frees_its_cache(tiny_glm: Path) -> None:
    """llama_model_free alone (no cache clear first) erases the model's cache: the registry was keyed by raw
    pointers, so a later model allocated at the same address could pick up a stale pack."""
    m = Model(tiny_glm, LoadOptions(extra_bufts=False))
    m.set_slots(SlotPlan.uniform(_trunk(m), 4, m.facts.n_expert), pack_host=True)
    ptr = m.ptr
    assert cache.pack_bytes(ptr) > 0
    m._L.llama_model_free(ptr)          # what a C user does: no llama_moeslots_cache_clear
    m.ptr = None
    assert cache.pack_bytes(ptr) == 0   # (a lookup by address only: the freed model is never dereferenced)


def test_swaps_after_a_context_was_freed(tiny_glm: Path) -> None:
    """A swap synchronises every context that decoded with the cache; a freed context must have left that set."""
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        f = m.facts
        with Context(m, n_ctx=128, threads=2) as ctx:
            stock = _script(ctx)
        plan = SlotPlan.uniform(_trunk(m), 4, f.n_expert)
        m.set_slots(plan, pack_host=True)
        for _ in range(3):
            with Context(m, n_ctx=128, threads=2) as ctx:
                _script(ctx)                                    # registers the context with the cache
        il = _trunk(m)[0]
        assert cache.swap(m.ptr, il, 0, 7) > 0                  # the freed contexts are not synchronised
        with Context(m, n_ctx=128, threads=2) as ctx:
            assert_identical(stock, _script(ctx), "after swaps")
            assert cache.swap(m.ptr, il, 1, 9) > 0              # a live context is synchronised first
            assert_identical(stock, _script(ctx), "after a swap with a live context")


def test_a_context_that_failed_to_start_is_not_synchronised(tiny_glm: Path) -> None:
    """A context's constructor builds graphs (the scheduler's reserve) and may throw after that (a quantized V
    cache without flash attention; out of memory for compute buffers): no destructor runs, so a context must not
    join the set swaps synchronise until it runs a graph — before, the failed context stayed in it and the next
    swap synchronised freed memory. Only contexts that decoded are in the set, and they leave it when freed."""
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        m.set_slots(SlotPlan.uniform(_trunk(m), 4, m.facts.n_expert), pack_host=True)
        cp = m._L.llama_context_default_params()
        cp.n_ctx, cp.n_threads, cp.n_threads_batch = 128, 2, 2
        cp.flash_attn_type = 0                                 # disabled
        cp.type_v = 8                                          # GGML_TYPE_Q8_0: refused after the reserve
        assert not m._L.llama_init_from_model(m.ptr, cp)
        assert cache.n_contexts(m.ptr) == 0
        il = _trunk(m)[0]
        assert cache.swap(m.ptr, il, 0, 7) > 0
        with Context(m, n_ctx=128, threads=2) as ctx:
            assert cache.n_contexts(m.ptr) == 0                # built its reserve graphs, ran none yet
            _script(ctx)
            assert cache.n_contexts(m.ptr) == 1
            assert cache.swap(m.ptr, il, 1, 9) > 0
        assert cache.n_contexts(m.ptr) == 0


def test_stage_races_configure_and_clear(tiny_glm: Path) -> None:
    """Stages on a worker thread while the main thread reconfigures and clears the cache: a stage holds its layer's
    pack until its copy ends (before, it wrote into a pack the reconfigure had freed), so nothing corrupts the heap
    and the engine stays exact."""
    with Model(tiny_glm, LoadOptions(extra_bufts=False)) as m:
        f = m.facts
        with Context(m, n_ctx=128, threads=2) as ctx:
            stock = _script(ctx)
        layers = _trunk(m)
        stop = threading.Event()
        staged = [0, 0]

        def stager() -> None:
            i = 0
            while not stop.is_set():
                il, e = layers[i % len(layers)], 8 + i % 8
                try:
                    cache.stage(m.ptr, il, e)
                    staged[0] += 1
                except CacheError:
                    staged[1] += 1                      # no cache, resident, or dropped while copying
                i += 1

        t = threading.Thread(target=stager)
        t.start()
        try:
            r = 0
            while r < 60 or (staged[0] < 20 and r < 3000):     # until stages have landed between the reconfigures
                r += 1
                if r % 3 == 2:
                    m.set_slots(SlotPlan({}), pack_host=True)
                else:
                    m.set_slots(SlotPlan.uniform(layers, 4 + r % 4, f.n_expert, offset=r % 5), pack_host=True,
                                spare=True)
        finally:
            stop.set()
            t.join()
        assert staged[0] > 0
        m.set_slots(SlotPlan.uniform(layers, 4, f.n_expert), pack_host=True, spare=True)
        with Context(m, n_ctx=128, threads=2) as ctx:
            assert_identical(stock, _script(ctx), "after racing stages")
