"""The bundled model: small enough to ship, the advertised shape (glm4moe, 64 experts, 4 used, a NextN block),
readable chat through its own template, and profiles recorded on it that fit it."""

from __future__ import annotations

import numpy as np

from moeslots.engine.api import Message
from moeslots.engine.llm.facts import inspect_gguf
from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.llm.template import render_chat
from moeslots.engine.machine import bundled
from moeslots.profiles.profile import from_trace
from moeslots.profiles.trace import read_csv


def test_shape_and_size() -> None:
    p = bundled.model()
    assert p.stat().st_size <= 24 * 2**20
    f = inspect_gguf(p)
    assert (f.arch, f.n_expert, f.n_expert_used, f.n_nextn) == ("glm4moe", 64, 4, 1)
    assert len([il for il in f.moe_layers if il < f.n_layer]) >= 6


def test_chat_answers_readable_text() -> None:
    with Model(bundled.model(), LoadOptions(extra_bufts=False)) as m, Context(m, n_ctx=512, threads=2) as ctx:
        prompt = render_chat(m, [Message("user", "What does `os.path.join` do?")])
        assert prompt.endswith("<|assistant|>\n")
        ctx.decode(m.tokenize(prompt, add_special=False, parse_special=True), prompt=True)
        out = b""
        for _ in range(48):
            t = ctx.argmax()
            if m.is_eog(t):
                break
            out += m.piece(t)
            ctx.decode([t])
        text = out.decode("utf-8", "replace")
        words = text.split()
        assert len(words) >= 5, text
        # trained text, not random bytes: mostly dictionary-like words of letters
        assert np.mean([w.strip(".,:;()`'\"").isalpha() for w in words]) > 0.6, text


def test_profiles_fit_the_model() -> None:
    f = inspect_gguf(bundled.model())
    traces = {w: read_csv(bundled.profile(w)) for w in ("code", "chat", "merged")}
    for w, t in traces.items():
        assert t.n_expert == f.n_expert and t.k == f.n_expert_used, w
        assert t.decode_tokens >= 2000 or w == "merged"
    assert traces["merged"].decode_tokens == traces["code"].decode_tokens + traces["chat"].decode_tokens
    p = from_trace(traces["merged"], f.n_layer + f.n_nextn, f.n_expert)
    assert all(p.counts[il].sum() > 0 for il in f.moe_layers if il < f.n_layer)
