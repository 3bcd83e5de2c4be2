"""Top-k, min-p and the repeat penalty (engine.api.Sampling, engine.mtp.sample): each alone and together against a
reference written out here, the defaults bit-identical to the sampler before them, greedy the argmax of the
penalised logits; bad values one line; in the engine (plain and MTP decoding) a strong repeat penalty breaks the
tiny model's loop exactly as penalised greedy decoding does, a chat's max tokens cuts the reply, and the defaults
give the same text as before."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

from moeslots.engine.api import Sampling
from moeslots.engine.llm.mtp import cut, penalised, probs, sample, softmax
from moeslots.engine.runtime.engine import Done, Engine, EngineConfig, Message


def _old_sample(logits: np.ndarray, temperature: float, rng: np.random.Generator, top_p: float = 1.0) -> int:
    """The sampler before top-k, min-p and the penalty, verbatim."""
    if temperature <= 0:
        return int(np.argmax(logits))
    p = softmax(logits, temperature, top_p)
    return int(rng.choice(p.size, p=p))


def _ref_penalty(logits: np.ndarray, penalty: float, last_n: int, recent: Sequence[int]) -> np.ndarray:
    """llama.cpp's repeat penalty, a token at a time: each distinct token of the window once."""
    out = logits.astype(np.float64)
    for t in set(list(recent)[-last_n:]):
        out[t] = out[t] / penalty if out[t] > 0 else out[t] * penalty
    return out


def _ref_support(logits: np.ndarray, top_k: int, min_p: float) -> set[int]:
    """Tokens top-k (highest first, ties: lower id first) then min-p (p >= min_p x p_max at temperature 1) keep."""
    order = sorted(range(logits.size), key=lambda i: (-float(logits[i]), i))
    kept = order[:top_k] if top_k else order
    z = np.array([float(logits[i]) for i in kept])
    p = np.exp(z - z.max())
    p /= p.sum()
    return {i for i, pi in zip(kept, p) if pi >= min_p * p.max()}


def _ref_probs(logits: np.ndarray, s: Sampling, recent: Sequence[int]) -> np.ndarray:
    """The whole rule by hand: penalty, top-k, min-p, softmax at the temperature, then the nucleus."""
    z = _ref_penalty(logits, s.repeat_penalty, s.repeat_last_n, recent)
    keep = sorted(_ref_support(z, s.top_k, s.min_p))
    p = np.zeros(z.size)
    e = np.exp((z[keep] - z[keep].max()) / s.temperature)
    p[keep] = e / e.sum()
    order = sorted(keep, key=lambda i: (-p[i], i))
    out, acc = np.zeros_like(p), 0.0
    for i in order:
        out[i], acc = p[i], acc + p[i]
        if acc >= s.top_p:
            break
    return out / out.sum()


@pytest.mark.parametrize("size", [50, 5000])
def test_the_defaults_draw_exactly_as_before(size: int) -> None:
    """Off (top-k 0, min-p 0, penalty 1): the same distribution bit for bit and the same draws from the same seed,
    recent tokens or not."""
    rng = np.random.default_rng(size)
    for temperature, top_p in ((0.0, 1.0), (0.0, 0.3), (0.7, 1.0), (1.3, 0.9)):
        logits = rng.normal(0, 3, size).astype(np.float32)
        recent = rng.integers(0, size, 40).tolist()
        s = Sampling(temperature, top_p)
        if temperature:
            assert np.array_equal(probs(logits, s, recent), softmax(logits, temperature, top_p))
        a, b = np.random.default_rng(7), np.random.default_rng(7)
        new = [sample(logits, s, a, recent=recent) for _ in range(60)]
        assert new == [_old_sample(logits, temperature, b, top_p) for _ in range(60)]
        assert penalised(logits, s, recent) is logits and cut(logits, s) is logits       # not even copied


def test_the_repeat_penalty_alone() -> None:
    s = Sampling(repeat_penalty=1.25, repeat_last_n=3)
    logits = np.array([2.0, 1.9, -1.0, -1.1, 0.5, 3.0], np.float32)
    got = penalised(logits, s, [5, 5, 0, 2, 2])              # the window: 0, 2, 2 (5 is older than the last 3)
    assert got.tolist() == pytest.approx([1.6, 1.9, -1.25, -1.1, 0.5, 3.0])   # repeats count once
    assert logits.tolist()[0] == 2.0                          # the engine's logits are not touched
    top = np.array([2.0, 1.9, 0.0], np.float32)
    assert sample(top, Sampling(repeat_penalty=1.1), np.random.default_rng(0), recent=[0]) == 1   # 2 / 1.1 < 1.9
    assert sample(top, Sampling(repeat_penalty=1.1, repeat_last_n=1), np.random.default_rng(0), recent=[0, 2]) == 0
    neg = np.array([-1.0, -1.05, -4.0], np.float32)
    assert sample(neg, Sampling(repeat_penalty=1.1), np.random.default_rng(0), recent=[0]) == 1   # -1.1 < -1.05
    assert sample(top, Sampling(repeat_penalty=1.1), np.random.default_rng(0)) == 0   # nothing recent: no penalty


def test_greedy_is_the_argmax_of_the_penalised_logits() -> None:
    """Temperature 0: the argmax of the penalised logits, exactly, whatever top-k, min-p, top-p and the seed say."""
    rng = np.random.default_rng(3)
    for trial in range(200):
        logits = rng.normal(0, 2, 300).astype(np.float32)
        recent = rng.integers(0, 300, int(rng.integers(0, 120))).tolist()
        pen, last_n = float(rng.uniform(1.0, 3.0)), int(rng.integers(1, 100))
        s = Sampling(0.0, float(rng.uniform(0.05, 1.0)), trial, int(rng.integers(0, 20)),
                     float(rng.uniform(0, 0.9)), pen, last_n)
        want = int(np.argmax(_ref_penalty(logits, pen, last_n, recent)))
        assert sample(logits, s, rng, recent=recent) == want
        assert want == int(np.argmax(penalised(logits, s, recent)))


def test_top_k_keeps_k() -> None:
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 2, 1000).astype(np.float32)
    for k in (1, 7, 40, 999):
        p = probs(logits, Sampling(1.0, top_k=k))
        assert set(np.flatnonzero(p).tolist()) == _ref_support(logits, k, 0.0) and np.count_nonzero(p) == k
    assert np.array_equal(probs(logits, Sampling(1.0, top_k=1000)), softmax(logits, 1.0))   # k >= vocab: no cut
    ties = np.array([1.0, 3.0, 2.0, 2.0, 2.0, 0.0], np.float32)
    assert np.flatnonzero(probs(ties, Sampling(1.0, top_k=3))).tolist() == [1, 2, 3]   # ties: lower ids first
    draws = {sample(logits, Sampling(2.0, top_k=5), rng) for _ in range(300)}
    assert draws == _ref_support(logits, 5, 0.0)


def test_min_p_keeps_tokens_at_least_min_p_times_the_top() -> None:
    rng = np.random.default_rng(6)
    logits = rng.normal(0, 2, 800).astype(np.float32)
    p1 = softmax(logits, 1.0)
    for min_p in (0.01, 0.1, 0.5, 1.0):
        for temperature in (0.5, 1.0, 2.0):
            got = probs(logits, Sampling(temperature, min_p=min_p))
            keep = np.flatnonzero(p1 >= min_p * p1.max())            # at temperature 1, before the temperature
            assert np.flatnonzero(got).tolist() == keep.tolist()
            e = np.exp((logits[keep].astype(np.float64) - logits.max()) / temperature)
            assert np.allclose(got[keep], e / e.sum())                  # the kept, at the temperature, renormalised
    assert np.count_nonzero(probs(logits, Sampling(1.0, min_p=1.0))) == 1   # only the most likely


def test_all_of_them_together() -> None:
    rng = np.random.default_rng(8)
    for trial in range(40):
        logits = rng.normal(0, 2.5, 400).astype(np.float32)
        recent = rng.integers(0, 400, 80).tolist()
        s = Sampling(float(rng.uniform(0.3, 2.0)), float(rng.uniform(0.3, 1.0)), None, int(rng.integers(1, 60)),
                     float(rng.uniform(0, 0.2)), float(rng.uniform(1.0, 2.0)), int(rng.integers(1, 80)))
        ref = _ref_probs(logits, s, recent)
        got = probs(logits, s, recent)
        assert np.allclose(got, ref, atol=1e-9) and set(np.flatnonzero(got)) == set(np.flatnonzero(ref)), trial
        draws = {sample(logits, s, rng, recent=recent) for _ in range(50)}
        assert draws <= set(np.flatnonzero(ref).tolist())


BAD = [(Sampling(top_k=-1), "top-k -1"), (Sampling(top_k=2.5), "top-k 2.5"),  # type: ignore[arg-type]
       (Sampling(min_p=1.5), "min-p 1.5"), (Sampling(min_p=float("nan")), "min-p"),
       (Sampling(repeat_penalty=0.9), "repeat penalty 0.9"), (Sampling(repeat_penalty=11.0), "repeat penalty 11"),
       (Sampling(repeat_last_n=0), "repeat window 0"), (Sampling(max_tokens=-5), "max tokens -5")]


@pytest.mark.parametrize("bad,needle", BAD)
def test_bad_values_are_one_line(bad: Sampling, needle: str) -> None:
    problem = bad.problem() or ""
    assert needle in problem and "\n" not in problem
    assert Sampling(0.7, 0.9, 1, 40, 0.05, 1.1, 128, 256).problem() is None


def test_the_line_names_what_is_on() -> None:
    assert Sampling().line() == "greedy" and Sampling(0.7, 0.9, 42).line() == "T 0.7 · top-p 0.9 · seed 42"
    assert Sampling(0.8, 1.0, None, 40, 0.05, 1.1, 128, 300).line() == \
        "T 0.8 · top-k 40 · min-p 0.05 · random seed · repeat 1.1 (last 128) · max 300 tokens"
    assert Sampling(top_k=40, min_p=0.1, repeat_penalty=1.2).line() == "greedy · repeat 1.2 (last 64)"  # k, p moot


# -- in the engine ---------------------------------------------------------------------------------------------

QUESTION = [Message("user", "sample something")]


def _chat(e: Engine, s: Sampling | None) -> tuple[list[int], Done]:
    """(the engine's tokens after the reply: prompt, reply, with MTP maybe a few decoded past its end; Done); a
    chat's max tokens passed as the app passes them (tui/chatpane.py: only when set)."""
    e.new_chat()
    limit = {"max_tokens": s.max_tokens} if s is not None and s.max_tokens else {}
    done = list(e.chat(QUESTION, sampling=s, **limit))[-1]
    assert isinstance(done, Done)
    return list(e._tokens), done


def _greedy_by_hand(e: Engine, prompt: list[int], n: int, s: Sampling) -> list[int]:
    """Penalised greedy decoding written out on the engine's own context (penalty 1: plain greedy, the text the
    engine gave before the penalty existed)."""
    ctx, toks, out = e.ctx, list(prompt), []
    ctx.reset()
    ctx.decode(prompt, prompt=True)
    while len(out) < n:
        t = int(np.argmax(_ref_penalty(ctx.logits(), s.repeat_penalty, s.repeat_last_n, toks)))
        if e.model.is_eog(t):
            break
        out.append(t)
        toks.append(t)
        ctx.decode([t])
    e.new_chat()
    return out


def test_the_engine_applies_the_penalty_and_max_tokens(tiny_glm: Path) -> None:
    """Plain and MTP decoding: the defaults give plain greedy's text (the tiny model loops), a strong repeat
    penalty gives penalised greedy's (no loop), a chat's max tokens cuts the reply to its first 5 tokens, and top-k 1
    makes a sampled reply (speculative sampling under MTP) the greedy one."""
    strong = Sampling(repeat_penalty=1.5, repeat_last_n=64)
    cases = {"none": None, "default": Sampling(), "strong": strong, "short": Sampling(max_tokens=5),
             "top1": Sampling(1.3, 0.9, 3, top_k=1)}
    got: dict[bool, dict[str, tuple[list[int], str]]] = {}
    prompt: list[int] = []
    for mtp in (False, True):
        e = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, max_tokens=24, mtp=mtp))
        try:
            got[mtp] = {}
            for name, s in cases.items():
                toks, done = _chat(e, s)
                if not prompt:                              # plain decoding keeps exactly prompt + reply
                    prompt = toks[:len(toks) - done.stats.tokens]
                assert toks[:len(prompt)] == prompt
                got[mtp][name] = (toks[len(prompt):len(prompt) + done.stats.tokens], done.text)
            if not mtp:
                plain = _greedy_by_hand(e, prompt, 24, Sampling())
                penalised_ref = _greedy_by_hand(e, prompt, 24, strong)
            assert (e.snapshot().mtp_drafted > 0) == mtp                      # MTP steps did run
        finally:
            e.close()
    for mtp in (False, True):
        r = got[mtp]
        assert r["default"] == r["none"] and r["default"][0] == plain and len(plain) == 24
        assert len(set(plain)) < len(plain)                                   # the unpenalised reply loops
        assert r["strong"][0] == penalised_ref and r["strong"][0] != plain
        assert len(set(penalised_ref)) == len(penalised_ref)                 # the penalty broke the loop
        assert r["short"][0] == plain[:5]
        assert r["top1"][0] == plain
    assert got[False] == got[True]                                            # MTP: the same text


def test_mtp_steps_draw_under_the_rules_the_sampler_told_them(tiny_glm: Path) -> None:
    """The engine's sampler hands the reply's rules to the draft context (sample(..., mtp=)): a speculative step's
    token after x then follows probs() of the target's logits under them (penalty and top-k 3 here), never a token
    they cut; a plain greedy run (greedy_tokens) drops them again."""
    from moeslots.engine.llm.model import Context, LoadOptions, Model
    from moeslots.engine.llm.mtp import MTP, greedy_tokens

    with Model(tiny_glm, LoadOptions(load_mtp=True)) as m, Context(m, n_ctx=128, threads=2) as ctx:
        prompt = m.tokenize("The expert cache")
        rules = Sampling(1.5, 1.0, None, top_k=3, repeat_penalty=2.0)
        ctx.decode(prompt, prompt=True)
        x = ctx.argmax()
        ctx.decode([x])
        p = probs(ctx.logits(), rules, prompt + [x])             # the target's distribution after x, the rules on
        mtp = MTP(m, ctx, n_draft=2, threads=2)
        rng = np.random.default_rng(0)
        counts = np.zeros(m.n_vocab, np.int64)
        trials = 400
        try:
            sample(ctx.logits(), rules, rng, recent=prompt, mtp=mtp)   # as the engine's first token of a reply
            assert mtp.rules == rules
            for _ in range(trials):
                ctx.reset()
                mtp.truncate(0)
                ctx.decode(prompt, prompt=True)
                counts[mtp.step(list(prompt), x, rules.temperature, rng, rules.top_p)[1]] += 1
            greedy_tokens(mtp, prompt, 4, m.is_eog)
            assert mtp.rules == Sampling()
        finally:
            mtp.close()
    support = np.flatnonzero(p)
    assert len(support) == 3 and set(np.flatnonzero(counts).tolist()) <= set(support.tolist())
    exp = p[support] * trials
    chi2 = float(((counts[support] - exp) ** 2 / exp).sum())
    assert chi2 < 13.8, (chi2, counts[support], exp)             # 2 degrees of freedom: p = 0.001
