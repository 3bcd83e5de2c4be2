"""User report item 8: the inspector's MTP line (AdaptiveMTP.line) showed impossible figures, "accept 12 % < 0 %"
(drafting off on an old decision while the break-even measured since fell to 0) and "< 2772 %" (a draft step
timed at 28.7 plain steps). Every figure is now a percentage in 0..100, the sign holds for the figures shown, and
a break-even that is not measured yet or over 100 % is said in words. No model: the controller's measurements are
set by hand."""

from __future__ import annotations

import re
import types

from hypothesis import given
from hypothesis import strategies as st

from moeslots.engine.runtime.mtp_auto import OFF, ON, PROBE, AdaptiveMTP


def _auto(state: str = ON, window: list[tuple[int, int]] | None = None, plain: float | None = None,
          mtp: float | None = None, fixed: float | None = None, n_draft: int = 1) -> AdaptiveMTP:
    """A controller in `state` whose window holds `window` (drafted, accepted) and whose steps took `plain` and
    `mtp` seconds (None: not timed yet), or with a fixed break-even."""
    auto = AdaptiveMTP(mtp=types.SimpleNamespace(n_draft=n_draft), sample=lambda logits: 0,   # type: ignore[arg-type]
                       fixed_break_even=fixed)
    auto.state = state
    auto._acc.extend(window or [])
    if plain is not None:
        auto._t_plain.append(plain)
    if mtp is not None:
        auto._t_mtp.append(mtp)
    return auto


def _figures(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"(-?[\d.]+) %", line)]


def test_no_drafts_yet() -> None:
    assert _auto().line() == "MTP on (measuring)"
    assert _auto(plain=0.01, mtp=0.0135).line() == "MTP on (measuring acceptance, break-even 35 %)"
    assert _auto(window=[(1, 1)] * 4).line() == "MTP on (accept 100 %, measuring break-even)"


def test_all_accepted_and_all_rejected() -> None:
    assert _auto(window=[(1, 1)] * 32, fixed=0.35).line() == "MTP on (accept 100 % ≥ 35 %)"
    assert _auto(OFF, window=[(1, 0)] * 32, fixed=0.35).line() == "MTP off (accept 0 % < 35 %; probe in 64 tokens)"
    assert _auto(PROBE, window=[(2, 0)] * 3, fixed=0.35).line() == "MTP off (accept 0 % < 35 %; probing)"


def test_a_break_even_at_zero_or_below() -> None:
    """The reported "accept 12 % < 0 %": drafting went off, then the plain steps timed since made an MTP step look
    no dearer than a plain one. A given negative break-even reads 0 % too."""
    window = [(25, 3)]                                                  # 12 %
    assert _auto(OFF, window, plain=0.02, mtp=0.015).line() == "MTP off (accept 12 % ≥ 0 %; probe in 64 tokens)"
    assert _auto(ON, window, fixed=-1.0).line() == "MTP on (accept 12 % ≥ 0 %)"


def test_a_break_even_over_100_percent() -> None:
    """The reported "< 2772 %": not even every draft accepted would pay."""
    line = _auto(OFF, [(25, 3)], plain=0.01, mtp=0.2872).line()
    assert line == "MTP off (accept 12 %, break-even over 100 %: drafts cannot pay; probe in 64 tokens)"
    assert _auto(ON, [(1, 1)], fixed=1.0).line() == "MTP on (accept 100 % ≥ 100 %)"        # 100 % still reachable


def test_the_sign_holds_for_the_figures_shown() -> None:
    assert _auto(ON, [(1000, 349)], fixed=0.35).line() == "MTP on (accept 34.9 % < 35.0 %)"   # equal once rounded
    assert _auto(ON, [(4, 3)], fixed=0.9).line() == "MTP on (accept 75 % < 90 %)"          # window not full yet
    assert _auto(OFF, [(1, 1)], plain=0.0, mtp=0.01).line().startswith("MTP off (accept 100 %, measuring")


@given(state=st.sampled_from([ON, OFF, PROBE]),
       window=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 6)), max_size=40),
       plain=st.none() | st.floats(0, 1), mtp=st.none() | st.floats(0, 30),
       fixed=st.none() | st.floats(allow_nan=True, allow_infinity=True), n_draft=st.integers(1, 4),
       since=st.integers(0, 10_000))
def test_every_figure_is_a_percentage_from_0_to_100(state: str, window: list[tuple[int, int]], plain: float | None,
                                                    mtp: float | None, fixed: float | None, n_draft: int,
                                                    since: int) -> None:
    auto = _auto(state, window, plain, mtp, fixed, n_draft)
    auto._since_probe = since                                           # past the gap: "probe in 0 tokens"
    line = auto.line()
    assert all(0 <= x <= 100 for x in _figures(line)), line
    assert re.fullmatch(r"MTP (on|off) \(.*\)", line) and not re.search(r"-\d", line) and "nan" not in line, line
    m = re.search(r"accept ([\d.]+) % (≥|<) ([\d.]+) %", line)
    if m:
        a, b = float(m.group(1)), float(m.group(3))
        assert (a >= b) if m.group(2) == "≥" else (a <= b), line        # the sign agrees with what it shows
