"""A decode that fails in the middle of a reply (as a fetch-split take that gave up on the GPU makes it fail): the
reply's generator raises the engine's reason, the engine is not left busy, and the next reply runs from a clean
state and gives the text a fresh engine gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeslots.engine.errors import EngineError
from moeslots.engine.llm import model as model_mod
from moeslots.engine.runtime.engine import Engine, EngineConfig, Message, TextDelta

WHY = "the GPU did not hand layer 3's inputs to the CPU's share of its experts within 60 s (--policy fetch-split)"


def _reply(e: Engine, ask: str) -> str:
    return "".join(ev.text for ev in e.chat([Message("user", ask)]) if isinstance(ev, TextDelta))


def test_a_decode_that_fails_mid_reply_stops_it_and_the_next_one_runs(tiny_glm: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = EngineConfig(model=tiny_glm, threads=2, pack_host=True, mtp=False, max_tokens=12)
    fresh = Engine(cfg)
    try:
        want = _reply(fresh, "Say something.")
    finally:
        fresh.close()
    decode = model_mod.Context.decode
    calls = {"n": 0}

    def fails_on_the_fifth_token(self, tokens, *, all_logits=False, prompt=False):   # type: ignore[no-untyped-def]
        if not prompt:
            calls["n"] += 1
            if calls["n"] == 5:
                raise EngineError(WHY)
        return decode(self, tokens, all_logits=all_logits, prompt=prompt)

    e = Engine(cfg)
    try:
        monkeypatch.setattr(model_mod.Context, "decode", fails_on_the_fifth_token)
        with pytest.raises(EngineError, match="did not hand layer 3's inputs"):
            _reply(e, "Say something.")
        monkeypatch.undo()
        assert not e.snapshot().generating
        e.new_chat()
        assert _reply(e, "Say something.") == want
    finally:
        e.close()
