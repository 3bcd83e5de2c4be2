"""Sampling per reply (engine.api.Sampling, the app's per-chat settings): top-p cuts the distribution to its nucleus,
exactly; temperature 0 stays greedy whatever top-p says; a seed repeats a reply; bad settings are one clear error;
speculative (MTP) sampling with top-p draws only from the target's nucleus."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moeslots.engine.api import Sampling
from moeslots.engine.errors import EngineError
from moeslots.engine.llm.mtp import NUCLEUS_FIRST, nucleus, sample, softmax
from moeslots.engine.runtime.engine import Done, Engine, EngineConfig, Message, TextDelta


def _ref_nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """The definition, by a full sort: most likely first (ties: lower id first), until the sum reaches top_p."""
    order = sorted(range(p.size), key=lambda i: (-p[i], i))
    out, acc = np.zeros_like(p), 0.0
    for i in order:
        out[i] = p[i]
        acc += p[i]
        if acc >= top_p:
            break
    return out / out.sum()


@pytest.mark.parametrize("size,top_p", [(10, 0.5), (5000, 0.9), (5000, 0.999), (3000, 0.05)])
def test_nucleus_is_the_smallest_most_likely_set(size: int, top_p: float) -> None:
    rng = np.random.default_rng(size)
    for peaked in (True, False):             # peaked: the nucleus within the first candidates; flat: wider than them
        logits = rng.normal(0, 4 if peaked else 0.01, size)
        p = softmax(logits, 1.0)
        got = nucleus(p, top_p)
        assert np.allclose(got, _ref_nucleus(p, top_p)) and got.sum() == pytest.approx(1.0)
    if size > NUCLEUS_FIRST and top_p >= 0.9:
        assert np.count_nonzero(got) > NUCLEUS_FIRST        # the flat case took the full sort


def test_greedy_ignores_top_p_and_sampling_stays_in_the_nucleus() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 3, 500)
    for top_p in (0.01, 0.5, 1.0):
        assert sample(logits, 0.0, rng, top_p) == int(np.argmax(logits))
    support = set(np.flatnonzero(nucleus(softmax(logits, 0.8), 0.6)).tolist())
    draws = {sample(logits, 0.8, rng, 0.6) for _ in range(400)}
    assert draws <= support and len(draws) > 1


@pytest.mark.parametrize("bad,needle", [(Sampling(-0.1), "temperature -0.1"), (Sampling(float("nan")), "temperature"),
                                        (Sampling(0.7, 0.0), "top-p 0.0"), (Sampling(0.7, 1.5), "top-p 1.5"),
                                        (Sampling(0.7, 0.9, -3), "seed -3")])
def test_bad_settings_are_one_line(bad: Sampling, needle: str) -> None:
    assert needle in (bad.problem() or "")
    assert Sampling(0.7, 0.9, 42).problem() is None and Sampling().greedy


@pytest.fixture(scope="module")
def engine(tiny_glm: Path):
    e = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, max_tokens=12, mtp=False))
    yield e
    e.close()


def _reply(e: Engine, sampling: Sampling | None) -> str:
    e.new_chat()
    parts, done = [], None
    for ev in e.chat([Message("user", "sample something")], sampling=sampling):
        if isinstance(ev, TextDelta):
            parts.append(ev.text)
        else:
            done = ev
    assert isinstance(done, Done) and "".join(parts) == done.text
    return done.text


def test_per_reply_sampling_in_the_engine(engine: Engine) -> None:
    greedy = _reply(engine, None)
    assert _reply(engine, Sampling(0.0, 0.2, 7)) == greedy                # temperature 0: greedy, exactly
    a = _reply(engine, Sampling(1.5, 0.95, 11))
    assert _reply(engine, Sampling(1.5, 0.95, 11)) == a                   # the same seed: the same reply
    assert _reply(engine, Sampling(1.5, 0.95, 12)) != a                   # another seed: another reply
    with pytest.raises(EngineError, match="sampling: top-p 2"):
        _reply(engine, Sampling(1.0, 2.0))
    assert _reply(engine, None) == greedy                                 # a refused reply changed nothing


def test_sampled_mtp_with_top_p_draws_only_from_the_nucleus(tiny_glm: Path) -> None:
    from moeslots.engine.llm.model import Context, LoadOptions, Model
    from moeslots.engine.llm.mtp import MTP

    with Model(tiny_glm, LoadOptions(load_mtp=True)) as m, Context(m, n_ctx=128, threads=2) as ctx:
        prompt = m.tokenize("The expert cache")
        T, top_p = 1.5, 0.3
        ctx.decode(prompt, prompt=True)
        x = ctx.argmax()
        ctx.decode([x])
        p = softmax(ctx.logits(), T, top_p)             # the target's nucleus after x
        mtp = MTP(m, ctx, n_draft=2, threads=2)
        rng = np.random.default_rng(0)
        seen: list[int] = []
        try:
            for _ in range(120):
                ctx.reset()
                mtp.truncate(0)
                ctx.decode(prompt, prompt=True)
                seen.append(mtp.step(list(prompt), x, temperature=T, rng=rng, top_p=top_p)[1])
        finally:
            mtp.close()
    support = set(np.flatnonzero(p).tolist())
    assert set(seen) <= support, (set(seen) - support)
    top = int(np.argmax(p))
    n = len(seen)
    assert abs(seen.count(top) - n * p[top]) < 4 * np.sqrt(n * p[top] * (1 - p[top])) + 1
