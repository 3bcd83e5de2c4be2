"""MTP on the synthetic glm4moe + NextN model: greedy output identical to plain greedy (cache off and on, draft
lengths 1-3), the const-head model accepts every draft, a model without NextN says so, a cancelled/rolled-back
state leaves the next generation exact."""

from __future__ import annotations

from pathlib import Path

import pytest
from specs import TINY_GLM

from moeslots.engine import synth
from moeslots.engine.errors import EngineError
from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.llm.mtp import MTP, greedy_tokens
from moeslots.engine.native.expert_cache import SlotPlan

PROMPT_TEXT = "The expert cache keeps a fixed set"


def plain_greedy(ctx: Context, prompt: list[int], n: int, is_eog) -> list[int]:
    ctx.reset()
    ctx.decode(prompt, prompt=True)
    out = []
    for _ in range(n):
        t = ctx.argmax()
        if is_eog(t):
            break
        out.append(t)
        ctx.decode([t])
    return out


@pytest.mark.parametrize("n_draft", [1, 3, 7])     # 7: a verify batch of 8 through the cache (engine v2)
@pytest.mark.parametrize("slots", [0, 6])
def test_mtp_greedy_equals_plain_greedy(tiny_glm: Path, n_draft: int, slots: int) -> None:
    with Model(tiny_glm, LoadOptions(load_mtp=True, extra_bufts=False)) as m:
        if slots:
            m.set_slots(SlotPlan.uniform(m.facts.moe_layers, slots, m.facts.n_expert), pack_host=True)  # NextN too
        with Context(m, n_ctx=256, threads=2) as ctx:
            prompt = m.tokenize(PROMPT_TEXT)
            ref = plain_greedy(ctx, prompt, 40, m.is_eog)
            mtp = MTP(m, ctx, n_draft=n_draft, threads=2)
            try:
                got = greedy_tokens(mtp, prompt, 40, m.is_eog)
                again = greedy_tokens(mtp, prompt, 40, m.is_eog)       # reused contexts: state fully reset
            finally:
                mtp.close()
        assert got == ref == again
        assert mtp.stats.drafted > 0 and mtp.stats.steps > 0


def test_const_head_accepts_everything(models_dir: Path) -> None:
    spec = synth.SynthSpec(**{**TINY_GLM.__dict__, "const_head": True, "seed": 21})
    p = synth.write_model(spec, models_dir / "const-head-mtp.gguf").path
    with Model(p, LoadOptions(load_mtp=True)) as m, Context(m, n_ctx=256, threads=2) as ctx:
        mtp = MTP(m, ctx, n_draft=3, threads=2)
        try:
            out = greedy_tokens(mtp, m.tokenize("hello"), 30, lambda t: False)
        finally:
            mtp.close()
        assert len(out) == 30
        assert mtp.stats.acceptance == 1.0 and mtp.stats.tokens_per_step == pytest.approx(4.0, rel=0.3)


def test_model_without_nextn_is_refused(tiny_qwen: Path) -> None:
    with Model(tiny_qwen, LoadOptions(load_mtp=True)) as m, Context(m, n_ctx=64, threads=2) as ctx:
        assert not m.mtp_loaded
        with pytest.raises(EngineError, match="NextN"):
            MTP(m, ctx)


def test_a_rolled_back_step_leaves_the_next_generation_exact(tiny_glm: Path) -> None:
    with Model(tiny_glm, LoadOptions(load_mtp=True)) as m, Context(m, n_ctx=256, threads=2) as ctx:
        prompt = m.tokenize(PROMPT_TEXT)
        ref = plain_greedy(ctx, prompt, 24, m.is_eog)
        mtp = MTP(m, ctx, n_draft=3, threads=2)
        try:
            greedy_tokens(mtp, m.tokenize("something else entirely"), 7, m.is_eog)   # stop mid-way ("cancel")
            assert greedy_tokens(mtp, prompt, 24, m.is_eog) == ref
        finally:
            mtp.close()


def test_sampled_mtp_keeps_the_target_distribution(tiny_glm: Path) -> None:
    """Speculative sampling: the token after x must follow the target's own distribution p (chi-square over the
    most likely tokens), whatever the drafts were."""
    import numpy as np

    from moeslots.engine.llm.mtp import softmax

    with Model(tiny_glm, LoadOptions(load_mtp=True)) as m, Context(m, n_ctx=256, threads=2) as ctx:
        prompt = m.tokenize(PROMPT_TEXT)
        T = 1.5
        ctx.decode(prompt, prompt=True)
        x = ctx.argmax()
        ctx.decode([x])
        p = softmax(ctx.logits(), T)                  # the target's distribution of the token after x
        mtp = MTP(m, ctx, n_draft=2, threads=2)
        rng = np.random.default_rng(0)
        counts = np.zeros(m.n_vocab, np.int64)
        trials = 1500
        try:
            for _ in range(trials):
                ctx.reset()
                mtp.truncate(0)
                ctx.decode(prompt, prompt=True)
                hist = list(prompt)
                out = mtp.step(hist, x, temperature=T, rng=rng)
                counts[out[1]] += 1
        finally:
            mtp.close()
        top = np.argsort(-p)[:8]
        obs = np.r_[counts[top], trials - counts[top].sum()]
        exp = np.r_[p[top], 1 - p[top].sum()] * trials
        chi2 = float(((obs - exp) ** 2 / exp).sum())
        assert chi2 < 26.1, (chi2, obs, exp)          # 8 degrees of freedom: p = 0.001
        assert mtp.stats.drafted == 2 * trials


def test_mtp_head_on_gpu_pattern_and_same_tokens() -> None:
    """The NextN block's experts can stay with their layer (GPU) while every trunk expert goes to host memory;
    on the CPU build nothing moves, and greedy MTP decoding gives the same tokens either way."""
    import re

    from moeslots.engine.machine import bundled
    from moeslots.engine.native import lib as native

    pat = re.compile(native.experts_pattern(keep_layer=7))
    assert not pat.search("blk.7.ffn_up_exps.weight") and not pat.search("blk.7.ffn_down_exps.weight")
    assert pat.search("blk.1.ffn_up_exps.weight") and pat.search("blk.17.ffn_gate_exps.weight")
    assert not pat.search("blk.1.ffn_up_shexp.weight") and not pat.search("blk.7.attn_q.weight")
    assert native.experts_pattern() == native.EXPERT_TENSOR_PATTERN
    outs = []
    for on_gpu in (False, True):
        with Model(bundled.model(), LoadOptions(load_mtp=True, mtp_head_on_gpu=on_gpu)) as m, \
                Context(m, n_ctx=256, threads=2) as ctx:
            mtp = MTP(m, ctx, n_draft=2, threads=2)
            try:
                outs.append(greedy_tokens(mtp, m.tokenize("def main():\n", add_special=False), 24, m.is_eog))
            finally:
                mtp.close()
    assert outs[0] == outs[1] and len(outs[0]) > 0


def test_the_prompt_is_in_both_caches_before_the_first_step(tiny_glm: Path) -> None:
    """Decode timing starts at on_prefilled: by then the target and the draft context hold the whole prompt, so
    the first step feeds nothing (the H200 bench once timed ~1.7 s of prompt work as MTP decoding)."""
    with Model(tiny_glm, LoadOptions(load_mtp=True, extra_bufts=False)) as m, Context(m, n_ctx=256, threads=2) as ctx:
        prompt = m.tokenize(PROMPT_TEXT)
        mtp = MTP(m, ctx, n_draft=1, threads=2)
        seen: list[tuple[int, int, int]] = []
        try:
            out = greedy_tokens(mtp, prompt, 12, m.is_eog,
                                on_prefilled=lambda: seen.append((ctx.n_past, mtp.fed, mtp.stats.steps)))
        finally:
            mtp.close()
        assert seen == [(len(prompt), len(prompt), 0)]
        assert out == plain_greedy(ctx, prompt, 12, m.is_eog)
