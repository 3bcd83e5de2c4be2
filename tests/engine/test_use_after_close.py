"""Use after close is refused, never a crash. Before, the Python API passed freed llama.cpp handles on: `decode()` on
a Context whose Model was closed, or on a closed Context, `Engine.chat()` on a closed engine, an MTP draft whose
target or model was closed, a reply generator resumed after `Engine.close()` — each a SIGSEGV (or a glibc abort,
"double free" / "vector::_M_range_check"), found by running each case in its own process on the old code. Now every
such call raises ClosedError (an EngineError) with a one-line reason, and closing twice stays harmless.

A Model closes what was built on it first (MTP drafts, then contexts) and a Context its MTP draft: llama.cpp frees a
context before its model, and a draft before the context it reads; left open they would point into freed memory,
and their own close() or __del__ would free them after what they use.

Each case runs in this process: a regression shows as a crash of the test run. CPU only, tiny synthetic models."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from moeslots.engine.errors import ClosedError, EngineError
from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.llm.mtp import MTP
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.runtime.engine import Done, Engine, EngineConfig, Message, TextDelta

MODEL_CLOSED = "the model is closed"
CONTEXT_CLOSED = "the context is closed"
DRAFT_CLOSED = "the MTP draft context is closed"
TARGET_CLOSED = "the MTP draft's target context is closed"
ENGINE_CLOSED = "this engine is closed"


def _model(path: Path) -> Model:
    """The NextN block loaded: the same model serves the MTP cases."""
    return Model(path, LoadOptions(load_mtp=True, extra_bufts=False))


def _refused(call: Callable[[], object], message: str) -> None:
    """call() raises ClosedError saying exactly `message` (and nothing crashed the process on the way)."""
    with pytest.raises(ClosedError) as err:
        call()
    assert str(err.value) == message
    assert isinstance(err.value, EngineError)        # callers that catch EngineError (the app) catch it too


# -- Model -----------------------------------------------------------------------------------------------------------

MODEL_CALLS: dict[str, Callable[[Model], object]] = {
    "tokenize": lambda m: m.tokenize("hello"),                  # old code: abort (vector::_M_range_check)
    "piece": lambda m: m.piece(5),                              # old code: read the freed vocab
    "is_eog": lambda m: m.is_eog(5),
    "set_slots": lambda m: m.set_slots(SlotPlan.uniform(m.facts.moe_layers, 4, m.facts.n_expert), pack_host=True),
    "Context": lambda m: Context(m, n_ctx=64, threads=2),  # llama_init_from_model(NULL)
}


@pytest.mark.parametrize("name", list(MODEL_CALLS))
def test_a_closed_model_refuses_every_call(tiny_glm: Path, name: str) -> None:
    m = _model(tiny_glm)
    m.close()
    _refused(lambda: MODEL_CALLS[name](m), MODEL_CLOSED)
    m.close()                                                    # closing twice: harmless


# -- Context ---------------------------------------------------------------------------------------------------------

CONTEXT_CALLS: dict[str, Callable[[Context], object]] = {
    "decode": lambda c: c.decode([1, 2, 3]),                    # old code: SIGSEGV (freed model or context)
    "logits": lambda c: c.logits(),                             # old code: SIGSEGV or "NULL pointer access"
    "argmax": lambda c: c.argmax(),
    "reset": lambda c: c.reset(),
    "truncate": lambda c: c.truncate(0),
    "read_stats": lambda c: c.read_stats(),
    "enable_stats": lambda c: c.enable_stats(64),
    "disable_stats": lambda c: c.disable_stats(),
    "graph_splits": lambda c: c.graph_splits(),
}


@pytest.mark.parametrize("name", list(CONTEXT_CALLS))
def test_a_context_whose_model_was_closed_refuses_every_call(tiny_glm: Path, name: str) -> None:
    """Model.close() closes the context first (its handle is gone: no later close or __del__ frees it after the
    model) and the context's calls say that the model was closed."""
    m = _model(tiny_glm)
    ctx = Context(m, n_ctx=64, threads=2)
    ctx.enable_stats(64)
    ctx.decode([1, 2, 3])
    m.close()
    assert ctx.ptr is None
    _refused(lambda: CONTEXT_CALLS[name](ctx), MODEL_CLOSED)
    ctx.close()                                                  # harmless after the model closed it
    m.close()


@pytest.mark.parametrize("name", list(CONTEXT_CALLS))
def test_a_closed_context_refuses_every_call_and_its_model_goes_on(tiny_glm: Path, name: str) -> None:
    with _model(tiny_glm) as m:
        ctx = Context(m, n_ctx=64, threads=2)
        ctx.decode([1, 2, 3])
        ctx.close()
        _refused(lambda: CONTEXT_CALLS[name](ctx), CONTEXT_CLOSED)
        ctx.close()                                              # closing twice: harmless
        with Context(m, n_ctx=64, threads=2) as again:           # the model is untouched: a new context works
            again.decode([1, 2, 3])
            assert 0 <= again.argmax() < m.n_vocab


# -- the MTP draft context ---------------------------------------------------------------------------------------------

DRAFT_CALLS: dict[str, Callable[[MTP], object]] = {
    "feed": lambda d: d.feed([1, 2, 3, 4], 4),                   # old code: SIGSEGV / double free
    "truncate": lambda d: d.truncate(0),
    "step": lambda d: d.step([1, 2, 3], 4),
}


def _draft(path: Path) -> tuple[Model, Context, MTP]:
    """A model, its target context with three tokens decoded, and the MTP draft context on it."""
    m = _model(path)
    ctx = Context(m, n_ctx=64, threads=2)
    d = MTP(m, ctx, n_draft=1, threads=2)
    ctx.decode([1, 2, 3])
    return m, ctx, d


@pytest.mark.parametrize("closed", ["draft", "target", "model"])
@pytest.mark.parametrize("name", list(DRAFT_CALLS))
def test_an_mtp_draft_refuses_use_after_its_own_its_targets_or_its_models_close(tiny_glm: Path, name: str,
                                                                             closed: str) -> None:
    """The draft reads its target context's state and the model's weights: closing either closes the draft
    first, and every draft call then names what was closed."""
    m, ctx, d = _draft(tiny_glm)
    try:
        {"draft": d, "target": ctx, "model": m}[closed].close()
        assert d.ptr is None and ctx.on_chunk is None            # (the target no longer feeds a freed draft)
        _refused(lambda: DRAFT_CALLS[name](d), {"draft": DRAFT_CLOSED, "target": TARGET_CLOSED,
                                                 "model": MODEL_CLOSED}[closed])
        d.close()                                                # closing twice: harmless
    finally:
        m.close()                                                # (closes what is still open)


def test_an_mtp_draft_is_refused_on_a_closed_target_or_model(tiny_glm: Path) -> None:
    """A new draft context on a freed target (its ctx_other) or a freed model is refused before llama.cpp sees it."""
    m = _model(tiny_glm)
    ctx = Context(m, n_ctx=64, threads=2)
    ctx.close()
    _refused(lambda: MTP(m, ctx, n_draft=1, threads=2), CONTEXT_CLOSED)
    ctx = Context(m, n_ctx=64, threads=2)
    m.close()                                                    # (closes ctx first)
    _refused(lambda: MTP(m, ctx, n_draft=1, threads=2), MODEL_CLOSED)


# -- Engine ----------------------------------------------------------------------------------------------------------

def _engine(path: Path, mtp: bool = True) -> Engine:
    return Engine(EngineConfig(model=path, n_ctx=256, threads=2, pack_host=True, mtp=mtp, max_tokens=8))


HI = [Message("user", "hello experts")]

ENGINE_CALLS: dict[str, Callable[[Engine, Path], object]] = {
    "chat": lambda e, tmp: list(e.chat(HI)),                   # old code: SIGSEGV
    "new_chat": lambda e, tmp: e.new_chat(),                   # old code: "worked" on freed contexts
    "set_slots": lambda e, tmp: e.set_slots(0),                # old code: CacheError "invalid arguments"
    "snapshot": lambda e, tmp: e.snapshot(),                   # old code: "routing stats are off"
    "start_recording": lambda e, tmp: e.start_recording(),     # old code: "worked"
    "stop_recording": lambda e, tmp: e.stop_recording(tmp / "p.csv"),
    "set_repick": lambda e, tmp: e.set_repick(8),
    "render_prompt": lambda e, tmp: e.render_prompt(HI),       # old code: SIGSEGV (the model's chat template)
}


@pytest.mark.parametrize("name", list(ENGINE_CALLS))
def test_a_closed_engine_refuses_every_call(tiny_glm: Path, tmp_path: Path, name: str) -> None:
    e = _engine(tiny_glm)
    assert e.mtp is not None                                     # the draft context is part of what was freed
    e.close()
    _refused(lambda: ENGINE_CALLS[name](e, tmp_path), ENGINE_CLOSED)
    e.close()                                                    # closing twice: harmless
    assert not (tmp_path / "p.csv").exists()


@pytest.mark.parametrize("mtp", [False, True])
def test_a_reply_consumed_after_close_raises(tiny_glm: Path, mtp: bool) -> None:
    """A chat() generator suspended at its first delta while the engine closes (timeout 0: the suspended reply
    holds the engine, so close() cannot wait for it — deterministic, no timing): close() leaves the native objects
    to the reply, which stops at its next token with ClosedError and frees them as it ends. (The old code decoded
    on freed contexts: SIGSEGV; the code before this freed them under the reply, which a prefill or a calibration,
    checking no cancel, could still be running on another thread.)"""
    e = _engine(tiny_glm, mtp=mtp)
    reply = e.chat(HI)
    assert isinstance(next(reply), TextDelta)
    e.close(timeout=0)
    assert e.model.ptr is not None and e.ctx.ptr is not None            # not freed under the reply
    with pytest.raises(ClosedError) as err:
        for ev in reply:
            assert not isinstance(ev, Done)                      # no reply "completes" on a closed engine
    assert str(err.value) == ENGINE_CLOSED                       # the engine's own check at the next token
    assert e.model.ptr is None and e.ctx.ptr is None                    # freed by the reply as it ended
    assert e.state.busy.acquire(blocking=False)                       # the ended reply let go of the engine
    e.state.busy.release()
    _refused(lambda: list(e.chat(HI)), ENGINE_CLOSED)
    e.close()


def test_an_open_engine_still_chats_after_a_closed_one(tiny_glm: Path) -> None:
    """Closing one engine leaves nothing behind that breaks the next (the app's model switch)."""
    _engine(tiny_glm).close()
    e = _engine(tiny_glm)
    try:
        events = list(e.chat(HI))
        assert isinstance(events[-1], Done) and events[-1].stats.tokens > 0
    finally:
        e.close()
