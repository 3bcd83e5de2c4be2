"""Adaptive MTP: drafting switches off below break-even and back on after a probe that clears it, the break-even
comes from measured step times, and switching never changes the greedy text."""

from __future__ import annotations

from pathlib import Path

import pytest
from specs import TINY_GLM

from moeslots.engine import synth
from moeslots.engine.runtime.engine import Done, Engine, EngineConfig, Message
from moeslots.engine.runtime.mtp_auto import OFF, ON, PROBE

PROMPTS = ["The expert cache keeps a fixed set", "hello there", "def f(x):", "a b c d e f g"]


def _reply(eng: Engine, q: str, n: int) -> str:
    eng.new_chat()
    out = [ev for ev in eng.chat([Message("user", q)], max_tokens=n) if isinstance(ev, Done)]
    return out[0].text


def test_switching_on_and_off_keeps_the_greedy_text(tiny_glm: Path) -> None:
    """A controller that flips every few steps (windows of 2 steps, probes every 3 tokens, a break-even that jumps
    between unreachable and nil every 5 steps) must give plain greedy decoding's text: the plain steps in between
    keep the draft context's states, the first MTP step after them feeds the rows it missed."""
    plain = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, mtp=False))
    try:
        ref = [_reply(plain, q, 48) for q in PROMPTS]
    finally:
        plain.close()
    eng = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, mtp=True, mtp_draft=1))
    try:
        auto = eng.mtp_auto
        assert auto is not None
        auto.window, auto.probe_every, auto.probe_max, auto.probe_steps = 2, 3, 3, 2
        auto._acc = type(auto._acc)(maxlen=2)
        auto.margin = 0.0
        states: list[str] = []
        orig = auto.step

        def spy(*a, **kw):
            auto.fixed_break_even = 2.0 if len(states) // 5 % 2 else -1.0
            out = orig(*a, **kw)
            states.append(auto.state)
            return out

        auto.step = spy  # type: ignore[method-assign]
        got = [_reply(eng, q, 48) for q in PROMPTS]
        assert got == ref
        flips = sum(1 for a, b in zip(states, states[1:]) if (a == ON) != (b == ON))
        assert auto.switches >= 6 and OFF in states and flips >= 6, (auto.switches, states)
        assert eng.mtp is not None and eng.mtp.stats.drafted > 0
    finally:
        eng.close()


def test_drafting_goes_off_below_break_even_and_back_on(models_dir: Path) -> None:
    """The const-head model accepts every draft. With a break-even it cannot reach drafting goes off after a
    window, probes fail and come further apart; once break-even is within reach a probe turns it back on."""
    spec = synth.SynthSpec(**{**TINY_GLM.__dict__, "const_head": True, "seed": 21})
    p = synth.write_model(spec, models_dir / "const-head-auto.gguf").path
    eng = Engine(EngineConfig(model=p, n_ctx=1024, threads=2, pack_host=True, mtp=True, mtp_draft=1))
    try:
        auto = eng.mtp_auto
        assert auto is not None
        auto.window, auto.probe_every, auto.probe_steps = 4, 8, 2
        auto._acc = type(auto._acc)(maxlen=4)
        auto.fixed_break_even = 1.01
        _reply(eng, "hello", 60)
        assert auto.state in (OFF, PROBE) and auto.switches == 1
        assert auto.acceptance == 1.0
        assert eng.snapshot().mtp_line.startswith("MTP off (accept 100 %, break-even over 100 %: drafts cannot pay")
        assert auto._probe_gap > auto.probe_every                    # failed probes back off
        drafted = eng.mtp.stats.drafted  # type: ignore[union-attr]
        auto.fixed_break_even = 0.3
        _reply(eng, "hello", 60)
        assert auto.state == ON and auto.switches == 2
        assert eng.snapshot().mtp_line == "MTP on (accept 100 % ≥ 30 %)"
        assert eng.mtp.stats.drafted > drafted + 10  # type: ignore[union-attr]
    finally:
        eng.close()


def test_break_even_comes_from_measured_step_times(tiny_glm: Path) -> None:
    """No given break-even: after a reply it is (t_mtp / t_plain - 1) / n_draft of the steps just timed, and
    the controller decides with it (on iff the window's acceptance clears it)."""
    import statistics

    eng = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, mtp=True, mtp_draft=2))
    try:
        auto = eng.mtp_auto
        assert auto is not None and auto.break_even is None and auto.line() == "MTP on (measuring)"
        _reply(eng, PROMPTS[0], 64)
        assert len(auto._t_plain) >= auto.calibrate and auto._t_mtp
        ratio = statistics.median(auto._t_mtp) / statistics.median(auto._t_plain)
        assert auto.break_even == pytest.approx(max(0.0, (ratio - 1) / 2))
        acc = auto.acceptance
        assert acc is not None
        if auto.state == ON and len(auto._acc) >= auto.window:
            assert acc >= auto.break_even
        snap = eng.snapshot()
        assert snap.mtp_line.startswith("MTP on" if auto.state == ON else "MTP off")
    finally:
        eng.close()


def test_mtp_auto_off_drafts_every_step(tiny_glm: Path) -> None:
    eng = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, mtp=True, mtp_auto=False))
    try:
        assert eng.mtp_auto is None
        _reply(eng, PROMPTS[1], 32)
        st = eng.mtp.stats  # type: ignore[union-attr]
        assert st.steps > 0 and st.drafted == st.steps and eng.snapshot().mtp_line == "MTP on (always)"
    finally:
        eng.close()
