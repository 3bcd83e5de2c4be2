"""The static expert cache on CPU (hot packs in a host buffer, both chains on the CPU): logits must be
bit-identical to stock llama.cpp at any number of slots, for decode batches 1-8 and across reconfigures;
bad plans give clear errors and leave the engine usable."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest
from exactness import _tokens, assert_identical
from exactness import exactness as _exactness
from specs import KQ_GLM

from moeslots.engine import synth
from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.native import expert_cache as cache
from moeslots.engine.native import lib as native
from moeslots.engine.native.expert_cache import CacheError, SlotPlan


class NodeNames:
    """cb_eval that records graph node names matching a pattern (to prove which path ran)."""

    def __init__(self, pattern: str):
        self.pat = re.compile(pattern.encode())
        self.seen: set[str] = set()
        self.callback = native.llama().ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, tp: int, ask: bool, _ud: object) -> bool:
        name = ctypes.string_at(tp + native.TENSOR_NAME_OFFSET)
        if self.pat.match(name):
            if ask:
                return True
            self.seen.add(name.decode())
        return not ask


@pytest.fixture(scope="module")
def kq_models(models_dir: Path) -> dict[str, Path]:
    return {q: synth.write_model(KQ_GLM, models_dir / f"cache-kq-{q}.gguf", quant=q, threads=2).path
            for q in ("q8_0", "q4_k_m")}


def test_exact_glm4moe_f32_with_nextn_slots(tiny_glm: Path) -> None:
    _exactness(tiny_glm, load_mtp=True)


def test_exact_qwen3moe_f16(tiny_qwen: Path) -> None:
    _exactness(tiny_qwen)


@pytest.mark.parametrize("quant", ["q8_0", "q4_k_m"])
def test_exact_quantized(kq_models: dict[str, Path], quant: str) -> None:
    _exactness(kq_models[quant])


def test_repacked_experts_are_refused_clearly(kq_models: dict[str, Path]) -> None:
    with Model(kq_models["q4_k_m"]) as m:          # CPU build: Q4_K experts land in CPU_REPACK
        with pytest.raises(CacheError, match="not in plain host memory"):
            m.set_slots(SlotPlan.uniform(m.facts.moe_layers, 2, m.facts.n_expert), pack_host=True)


def test_every_batch_size_takes_the_two_chains(tiny_qwen: Path) -> None:
    """No zero slot: prompts, verify batches and single tokens all read resident experts from the pack and the
    others from host memory, one add per layer (before, batches of 5 or more tokens took the stock path)."""
    with Model(tiny_qwen) as m:
        m.set_slots(SlotPlan.uniform(m.facts.moe_layers, 4, m.facts.n_expert), pack_host=True)
        names = NodeNames(r"^ffn_moe_(down_sum|ids_slots|ids_host)-\d+$")
        with Context(m, n_ctx=512, threads=2, cb_eval=names.callback) as ctx:
            for n, seed in ((40, 3), (3, 4), (5, 5), (64, 6), (1, 7)):
                names.seen.clear()
                ctx.decode(_tokens(m.n_vocab, n, seed))
                for what in ("down_sum", "ids_slots", "ids_host"):
                    assert {f"ffn_moe_{what}-{il}" for il in m.facts.moe_layers} <= names.seen, (n, what)


def test_reconfigure_keeps_the_chat_exact(tiny_qwen: Path) -> None:
    """0 -> 16 -> 4 -> all slots in the middle of one conversation, without reloading: the continuing
    decode must match stock token for token (graphs are rebuilt after each change)."""
    with Model(tiny_qwen) as m:
        facts = m.facts
        toks = _tokens(m.n_vocab, 40, 9)
        with Context(m, n_ctx=256, threads=2) as ctx:
            ctx.decode(toks[:8], all_logits=True)
            stock = [ctx.logits(i).copy() for i in range(8)]
            for t in toks[8:]:
                ctx.decode([t])
                stock.append(ctx.logits().copy())
            ctx.reset()
            got: list[np.ndarray] = []
            ctx.decode(toks[:8], all_logits=True)
            got += [ctx.logits(i).copy() for i in range(8)]
            schedule = {8: 0, 16: 16, 24: 4, 32: facts.n_expert}
            for i, t in enumerate(toks[8:], start=8):
                if i in schedule:
                    m.set_slots(SlotPlan.uniform(facts.moe_layers, min(schedule[i], facts.n_expert),
                                                 facts.n_expert, offset=i), pack_host=True)
                ctx.decode([t])
                got.append(ctx.logits().copy())
            assert_identical(stock, got, "reconfigured mid-chat")
            m.set_slots(SlotPlan({}), pack_host=True)
            assert cache.pack_bytes(m.ptr) == 0


@pytest.mark.parametrize("plan,needle", [
    ({1: (0, 99)}, "expert id 99 out of range"),
    ({1: (3, 3)}, "expert 3 listed twice"),
    ({1: tuple(range(17))}, "17 slots, the model has 16 experts"),
    ({0: (1,)}, "layer 0: not a MoE layer"),
    ({7: (1,)}, "the plan names layer 7"),
])
def test_bad_plans_are_refused_and_the_engine_stays_usable(tiny_glm: Path, plan: dict, needle: str) -> None:
    with Model(tiny_glm) as m, Context(m, n_ctx=128, threads=2) as ctx:
        ctx.decode([5, 6, 7])
        before = ctx.logits().copy()
        with pytest.raises(CacheError, match=re.escape(needle)):
            m.set_slots(SlotPlan(plan), pack_host=True)
        assert m.cache_line == "expert cache: off"
        ctx.reset()
        ctx.decode([5, 6, 7])
        assert np.array_equal(before, ctx.logits())


def test_a_pack_that_does_not_fit_frees_everything(tiny_qwen: Path) -> None:
    with Model(tiny_qwen) as m, Context(m, n_ctx=128, threads=2) as ctx:
        plan = SlotPlan.uniform(m.facts.moe_layers, 8, m.facts.n_expert)
        line = m.set_slots(plan, pack_host=True)
        assert cache.pack_bytes(m.ptr) > 0 and "8 slots" in line
        with pytest.raises(CacheError, match=r"does not fit: .* MiB wanted, budget 0\.0 MiB") as ei:
            m.set_slots(plan, pack_host=True, max_bytes=1000)
        assert ei.value.code == cache.ERR_NO_MEMORY
        assert cache.pack_bytes(m.ptr) == 0
        ctx.decode([1, 2, 3])                      # still usable, now without a cache
        assert np.isfinite(ctx.logits()).all()


def test_no_gpu_means_no_slots_without_host_packs(tiny_qwen: Path) -> None:
    if native.gpus():
        pytest.skip("a GPU is present")
    with Model(tiny_qwen) as m:
        with pytest.raises(CacheError, match="no GPU to hold slots"):
            m.set_slots(SlotPlan.uniform(m.facts.moe_layers, 2, m.facts.n_expert))


def test_fully_resident_layers_build_no_host_chain(tiny_qwen: Path) -> None:
    """Patch 0002: with every expert of a layer in slots the host chain would add zeros, so it is not built (no
    host round trip for that layer); a layer with fewer slots keeps both chains; logits stay bit-identical."""
    toks = _tokens(200, 8, 11)
    with Model(tiny_qwen, LoadOptions(extra_bufts=False)) as m:
        f = m.facts
        with Context(m, n_ctx=64, threads=2) as ctx:
            stock = decode_steps(ctx, toks)
        full, part = f.moe_layers[0], f.moe_layers[1]
        m.set_slots(SlotPlan({full: tuple(range(f.n_expert)), part: (0, 1, 2)}), pack_host=True)
        names = NodeNames(r"^ffn_moe_(ids_host|ids_slots)-\d+$")
        with Context(m, n_ctx=64, threads=2, cb_eval=names.callback) as ctx:
            got = decode_steps(ctx, toks)
        assert f"ffn_moe_ids_slots-{full}" in names.seen and f"ffn_moe_ids_host-{full}" not in names.seen
        assert f"ffn_moe_ids_host-{part}" in names.seen
        assert_identical(stock, got, "fully resident layer")


def decode_steps(ctx: Context, toks: list[int], n_prompt: int = 2) -> list[np.ndarray]:
    """Logits of a short prompt's last row, then of each following token decoded one at a time."""
    ctx.decode(toks[:n_prompt], prompt=True)
    out = [ctx.logits().copy()]
    for t in toks[n_prompt:]:
        ctx.decode([t])
        out.append(ctx.logits().copy())
    return out
