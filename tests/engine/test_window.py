"""A chat longer than the context goes on (engine.window): the oldest turns leave the model's prompt, never the
system prompt nor the question; dropping starts exactly when the chat plus the reply's room outgrows the context and
is said in TurnStats.dropped; a recurrent model re-reads once per cut and resumes from its checkpoint otherwise; a
message that alone does not fit gets one line. And the default context: the model's trained length, capped (32768,
and the free memory)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest
from specs import TINY_GLM

from moeslots.engine import synth
from moeslots.engine.errors import EngineError
from moeslots.engine.llm import ggufhead, recurrent
from moeslots.engine.llm.model import Context
from moeslots.engine.runtime import window
from moeslots.engine.runtime.engine import Done, Engine, EngineConfig, Message

N_CTX = 256
MAX_TOKENS = 16                      # the reply's room: min(16, 256 // 4)
SYSTEM = Message("system", "You are terse.")
TOL = 1e-3                           # as tests/engine/test_recurrent_turns.py: batch-split rounding stays under it


def _question(i: int) -> Message:
    return Message("user", f"question {i}: tell me about the expert cache and its slots")


class Spy:
    """Every message list the engine renders, and the prompt tokens each gives."""

    def __init__(self, e: Engine) -> None:
        self.rendered: list[list[Message]] = []
        render = e.render_prompt

        def spy(ms: Sequence[Message]) -> str:
            self.rendered.append(list(ms))
            return render(ms)

        e.render_prompt = spy  # type: ignore[method-assign]
        self.e, self.render = e, render

    def tokens(self, ms: Sequence[Message]) -> list[int]:
        return self.e.model.tokenize(self.render(ms), add_special=True, parse_special=True)

    def read(self, prompt: list[int]) -> list[Message]:
        """The messages the engine's prompt was rendered from."""
        found = [ms for ms in self.rendered if self.tokens(ms) == prompt]
        assert found, "the prompt is none of the rendered chats"
        return found[-1]


def _turns(e: Engine, n: int) -> tuple[list[Message], list[tuple[int, Done, list[Message], int]]]:
    """n questions in one chat (MTP off: the engine holds the prompt, then the reply's tokens); per turn the whole
    chat's prompt length, the Done, the messages the model read and the length of its prompt."""
    spy = Spy(e)
    msgs, out = [SYSTEM], []
    for i in range(n):
        msgs.append(_question(i))
        full = len(spy.tokens(msgs))
        spy.rendered.clear()
        done = [ev for ev in e.chat(msgs) if isinstance(ev, Done)]
        assert len(done) == 1, f"turn {i}: no reply"
        d = done[0]
        prompt = e._tokens[:len(e._tokens) - d.stats.tokens]
        out.append((full, d, spy.read(prompt), len(prompt)))
        msgs.append(Message("assistant", d.text))
    return msgs, out


def test_a_chat_longer_than_the_context_goes_on(tiny_glm: Path) -> None:
    e = Engine(EngineConfig(model=tiny_glm, n_ctx=N_CTX, threads=2, pack_host=True, max_tokens=MAX_TOKENS,
                            mtp=False))
    try:
        msgs, turns = _turns(e, 8)
        assert e.ctx.n_ctx == N_CTX
    finally:
        e.close()
    over = [full + MAX_TOKENS > N_CTX for full, _, _, _ in turns]     # the chat and the reply's room outgrow it
    assert over[0] is False and over[-1] is True and turns[-1][0] > N_CTX
    start = over.index(True)
    assert [d.stats.dropped > 0 for _, d, _, _ in turns] == [i >= start for i in range(len(turns))]
    for i, (_, d, read, n) in enumerate(turns):
        asked = msgs[:2 * i + 2]                                   # the chat when turn i was asked
        assert read[0] == SYSTEM and read[-1] == _question(i)     # the system prompt and the question stay
        assert read[1:] == asked[1 + d.stats.dropped:]             # the newest messages, whole turns
        assert d.stats.dropped % 2 == 0 and d.stats.n_ctx == N_CTX and n + MAX_TOKENS <= N_CTX
    # the turns after a cut keep its start: they read only what is new (the KV of the rest is kept)
    same = [(d, n) for (_, d, _, n), (_, prev, _, _) in zip(turns[1:], turns)
            if d.stats.dropped == prev.stats.dropped > 0]
    assert same and all(d.stats.prompt_tokens < n // 2 for d, n in same)


def test_a_message_that_alone_does_not_fit_is_one_line(tiny_glm: Path) -> None:
    e = Engine(EngineConfig(model=tiny_glm, n_ctx=N_CTX, threads=2, pack_host=True, max_tokens=MAX_TOKENS,
                            mtp=False))
    try:
        long = Message("user", " ".join(f"word{i}" for i in range(400)))
        with pytest.raises(EngineError) as err:
            list(e.chat([SYSTEM, _question(0), Message("assistant", "ok"), long]))
        line = str(err.value)
        assert "\n" not in line and line.startswith("the system prompt and your message do not fit the context (")
        assert f"it holds {N_CTX}" in line and "--ctx" in line
        with pytest.raises(EngineError, match=r"^your message does not fit the context \(\d+ tokens; it holds 256\)"):
            list(e.chat([long]))
        done = [ev for ev in e.chat([SYSTEM, _question(1)]) if isinstance(ev, Done)]   # and the chat goes on
        assert len(done) == 1 and done[0].stats.dropped == 0
    finally:
        e.close()


def test_a_recurrent_model_goes_on_and_resumes_between_cuts(tiny_q35: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """qwen35moe (gated delta-net + attention): a cut re-reads the prompt from the start (its recurrent state cannot
    be cut back), the turns after it resume from the checkpoint; after every prefill the state is a fresh
    context's on the messages the model reads."""
    logits: list[np.ndarray] = []
    save = recurrent.save

    def probe(ctx: Context) -> recurrent.Checkpoint:
        logits.append(ctx.logits().copy())
        return save(ctx)

    monkeypatch.setattr(recurrent, "save", probe)
    e = Engine(EngineConfig(model=tiny_q35, n_ctx=N_CTX, threads=2, pack_host=True, max_tokens=MAX_TOKENS,
                            mtp=False))
    bad = []
    try:
        spy = Spy(e)
        msgs = [SYSTEM]
        dropped = []
        for i in range(8):
            msgs.append(_question(i))
            d = [ev for ev in e.chat(msgs) if isinstance(ev, Done)][0]
            prompt = e._tokens[:len(e._tokens) - d.stats.tokens]
            assert spy.read(prompt)[0] == SYSTEM
            with Context(e.model, n_ctx=512, threads=2) as fresh:
                fresh.decode(prompt)
                err = float(np.abs(logits[-1] - fresh.logits()).max())
            if err > TOL:
                bad.append((i, err))
            dropped.append((d.stats.dropped, d.stats.reread))
            msgs.append(Message("assistant", d.text))
    finally:
        e.close()
    assert not bad, f"prefill states off (turn, max |dlogit|): {bad}"
    cuts = [i for i in range(1, len(dropped)) if dropped[i][0] != dropped[i - 1][0]]
    assert cuts and dropped[0] == (0, False)
    assert all(dropped[i][1] for i in cuts)                              # a new cut: read again from the start
    kept = [i for i in range(1, len(dropped)) if i not in cuts]
    assert kept and not any(dropped[i][1] for i in kept)                 # the same start: resumed, not re-read


# -- the window alone (a tokenizer of 2 tokens per message + 1 per word) --------------------------------------------


def _count(ms: Sequence[Message]) -> list[int]:
    return [0] * sum(2 + len(m.content.split()) for m in ms)


def _chat(n: int, words: int = 8) -> list[Message]:
    msgs = [Message("system", "be brief")]
    for i in range(n):
        msgs += [Message("user", " ".join(["q"] * words)), Message("assistant", " ".join([f"a{i}"] * words))]
    return msgs


def test_the_window_cuts_whole_turns_with_room_and_keeps_its_start() -> None:
    w = window.Window()
    msgs = _chat(3) + [Message("user", "q q")]                   # 4 + 3 * 20 + 4 = 68 tokens
    fit = w.fit(msgs, _count, 100, 32)                           # 68 + min(32, 25) <= 100: all of it
    assert fit.dropped == 0 and fit.messages == msgs and len(fit.tokens) == 68
    msgs = _chat(5) + [Message("user", "q q")]                   # 108: 3 turns leave (48 + 25 + 25 slack <= 100)
    fit = w.fit(msgs, _count, 100, 32)
    assert fit.messages[0] == msgs[0] and fit.messages[1:] == msgs[7:] and fit.dropped == 6
    assert len(fit.tokens) == 108 - 3 * 20 == 48
    grown = msgs + [Message("assistant", "a"), Message("user", "q")]   # the next turn (54 + 25 fits): same start
    assert w.fit(grown, _count, 100, 32).dropped == 6
    assert window.Window().fit(grown, _count, 100, 32).dropped == 8     # (a fresh cut of this chat: 4 turns)
    w.reset()                                                    # a new chat: nothing left out before
    assert w.fit(grown, _count, 100, 32).dropped == 8
    other = _chat(2) + [Message("user", "q")]                    # another chat (not a new_chat): starts afresh
    assert window.Window().fit(other, _count, 100, 32).dropped == 0
    w2 = window.Window()
    w2.fit(msgs, _count, 100, 32)
    assert w2.fit(other, _count, 100, 32).dropped == 0


def test_the_window_without_a_system_prompt_and_a_too_long_question() -> None:
    msgs = _chat(4)[1:] + [Message("user", "q")]
    fit = window.Window().fit(msgs, _count, 60, 8)               # 83: reply room 8, a cut leaves 15 more free
    assert fit.messages == msgs[6:] and fit.dropped == 6 and len(fit.tokens) == 23
    with pytest.raises(EngineError, match=r"^your message does not fit the context \(53 tokens; it holds 53\)"):
        window.Window().fit([Message("user", " ".join(["w"] * 51))], _count, 53, 8)
    # the question alone fits but not with the reply's room: it is read, the reply gets what is left
    fit = window.Window().fit(_chat(1) + [Message("user", " ".join(["w"] * 40))], _count, 60, 16)
    assert [m.role for m in fit.messages] == ["system", "user"] and len(fit.tokens) == 4 + 42


# -- the default context ----------------------------------------------------------------------------------------


def _header(arch: str = "glm4moe", **kv: object) -> ggufhead.Header:
    arrays = {k: v for k, v in kv.items() if isinstance(v, tuple)}
    meta = {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in kv.items() if not isinstance(v, tuple)}}
    meta.update({f"{arch}.{k}#len": len(v) for k, v in arrays.items()})
    return ggufhead.Header(3, meta, (), 0, {f"{arch}.{k}": v for k, v in arrays.items()})


SHAPE = {"block_count": 48, "embedding_length": 2048, "attention.head_count": 32, "attention.head_count_kv": 4,
         "attention.key_length": 128, "attention.value_length": 128}     # Qwen3-30B-A3B's attention


def test_the_default_context_follows_the_model_and_is_capped() -> None:
    GiB = 1 << 30
    assert window.kv_bytes_per_token(_header(**SHAPE)) == 48 * 4 * 256 * 2          # 96 KiB a position
    s = window.default_ctx(_header(context_length=8192, **SHAPE), 80 * GiB)
    assert s == window.Sized(8192, "")                                              # the model's own length
    s = window.default_ctx(_header(context_length=262144, **SHAPE), 80 * GiB)
    assert s.n_ctx == 32768 and "32768 of the model's 262144" in s.line and "--ctx" in s.line
    s = window.default_ctx(_header(context_length=262144, **SHAPE), 4 * GiB, "VRAM")  # 1 GiB of KV: 10922 -> 10752
    assert s.n_ctx == 10752 and s.n_ctx * 96 * 1024 <= GiB and "quarter of the free VRAM (4.0 GiB)" in s.line
    assert window.default_ctx(_header(context_length=262144, **SHAPE), 64 << 20).n_ctx == 2048   # the floor
    assert window.default_ctx(_header(context_length=1024, **SHAPE), 64 << 20).n_ctx == 1024
    assert window.default_ctx(_header(**SHAPE), None).n_ctx == 4096                # no length said: as before
    # a hybrid: attention every 4th layer; per-layer KV heads (0: a recurrent layer)
    hybrid = {**SHAPE, "full_attention_interval": 4}
    assert window.kv_bytes_per_token(_header("qwen35moe", **hybrid)) == 12 * 4 * 256 * 2
    per_layer = {**SHAPE, "block_count": 4, "attention.head_count_kv": (0, 4, 0, 4)}
    assert window.kv_bytes_per_token(_header("nemotron_h_moe", **per_layer)) == 8 * 256 * 2


@pytest.mark.parametrize("trained,want", [(1536, 1536), (65536, 32768)])
def test_an_engine_without_ctx_sizes_it_from_the_model(models_dir: Path, trained: int, want: int) -> None:
    spec = dataclasses.replace(TINY_GLM, n_ctx=trained)
    path = synth.write_model(spec, models_dir / f"window-glm-{trained}.gguf").path
    e = Engine(EngineConfig(model=path, n_ctx=0, threads=2, pack_host=True, max_tokens=8, mtp=False))
    try:
        assert e.ctx.n_ctx == want
        assert any(f"{want} of the model's {trained}" in n for n in e.notices) == (want < trained)
    finally:
        e.close()
    e = Engine(EngineConfig(model=path, n_ctx=512, threads=2, pack_host=True, max_tokens=8, mtp=False))
    try:
        assert e.ctx.n_ctx == 512                                                   # asked for: it wins
    finally:
        e.close()
