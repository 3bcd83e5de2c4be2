"""User report items 2, 7 and 10: Ctrl+C stops a streaming reply as Esc does (with no reply it stays Textual's:
copy, or how to quit); the inspector's tok/s is live while a reply streams and the reply's own figure after it;
Esc followed at once by a key (one Alt+key to Textual's input parser) still stops the reply, and a question sent
while a reply runs waits for it to end instead of being refused. Each app test failed on the code before.

The replies are held open by a gate (the test lets them end), not timed: nothing here depends on how fast a busy
box runs."""

from __future__ import annotations

import itertools
import threading
from typing import Callable, Iterator

from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until
from textual._xterm_parser import XTermParser
from textual.events import Key
from textual.widgets import Digits

from moeslots.engine.api import Done, TextDelta, TurnStats
from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.mdtext import mark_stopped
from moeslots.tui.store import Store
from moeslots.tui.stream import ReplyBuffer

REPLY = " ".join(f"word{i}" for i in range(40))


class GatedEngine(FakeEngine):
    """Says the first `before` words of its reply, then holds the reply open until the test sets `gate` (or the
    reply is stopped), then says the rest. `gate` stays set once set: later replies run straight through."""

    def __init__(self, before: int = 5) -> None:
        super().__init__(reply=REPLY)
        self.before = before
        self.gate = threading.Event()
        self.held = threading.Event()               # set while a reply waits at the gate

    def chat(self, messages, cancel=None, sampling=None) -> Iterator[TextDelta | Done]:  # noqa: ANN001
        self.seen.append(list(messages))
        cancel = cancel or threading.Event()
        out: list[str] = []
        for i, w in enumerate(self.reply.split(" ")):
            if i == self.before:
                self.held.set()
                for _ in range(3000):               # at most 30 s: a test that forgets the gate still ends
                    if self.gate.wait(0.01) or cancel.is_set():
                        break
                self.held.clear()
            if cancel.is_set():
                break
            out.append((" " if i else "") + w)
            yield TextDelta(out[-1])
        yield Done(TurnStats(5, 0.01, len(out), 0.1, cancel.is_set(), 0.5), "".join(out))


def _ticks(step: float) -> Callable[[], float]:
    """A clock that moves `step` seconds at each reading: the live rate comes out exactly 1 / step."""
    n = itertools.count()
    return lambda: next(n) * step


def _notes(app: MoeslotsApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def _ask_and_hold(app: MoeslotsApp, eng: GatedEngine, pilot, text: str) -> None:  # noqa: ANN001
    """Sends `text`; returns once its reply has said its first words and waits at the gate."""
    app.query_one(Prompt).text = text
    await pilot.press("enter")
    await wait_until(pilot, lambda: app.busy and eng.held.is_set(), timeout=30)


# -- item 2: Ctrl+C -------------------------------------------------------------------------------------------


async def test_ctrl_c_stops_a_streaming_reply_as_esc_does(store: Store) -> None:
    eng = GatedEngine()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await _ask_and_hold(app, eng, pilot, "round 1")
        await pilot.press("ctrl+c")
        assert app.chat_pane.cancel.is_set()                                       # stopped at once, as Esc
        await wait_until(pilot, lambda: not app.busy, timeout=30)
        said = " ".join(REPLY.split(" ")[:eng.before])
        assert store.messages(app.chat_id) == [("user", "round 1"), ("assistant", mark_stopped(said))]   # cut there
        assert app.query_one(Prompt).text == "round 1"                    # given back, as after Esc
        assert not [n for n in _notes(app) if "quit" in n]                # not Textual's "press ctrl+q to quit"


async def test_ctrl_c_with_no_reply_is_textuals_copy_or_how_to_quit(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        prompt = app.query_one(Prompt)
        prompt.text = "copy me"
        prompt.select_all()
        await pilot.press("ctrl+c")
        assert app.clipboard == "copy me" and prompt.text == "copy me"     # the prompt box copies its selection
        prompt.text = ""
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert [n for n in _notes(app) if "ctrl+q" in n and "quit" in n]    # how to quit
        assert app.is_running


# -- item 7: live tok/s ---------------------------------------------------------------------------------------


async def test_the_inspector_shows_a_live_tok_s_while_a_reply_streams(store: Store) -> None:
    eng = GatedEngine()                             # the engine's figure for the last reply: 42.0 (FakeEngine)
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(160, 48)) as pilot:
        toks, unit = app.query_one("#toks", Digits), app.query_one("#toks-unit")
        await wait_until(pilot, lambda: toks.value == "42.0")
        app.chat_pane.reply = ReplyBuffer(clock=_ticks(0.1))            # a piece every 0.1 s: 10 tok/s
        await _ask_and_hold(app, eng, pilot, "round 1")
        await wait_until(pilot, lambda: toks.value == "10.0", timeout=30)  # live, not the last reply's 42.0
        assert "live" in str(unit.render())                            # and says so
        eng.gate.set()
        await wait_until(pilot, lambda: not app.busy, timeout=30)
        await wait_until(pilot, lambda: toks.value == "42.0" and "live" not in str(unit.render()))   # the reply's


def test_reply_buffer_rate_is_pieces_after_the_first_over_their_time() -> None:
    buf = ReplyBuffer(clock=_ticks(0.5))
    assert buf.rate() is None
    buf.put("a")
    assert buf.rate() is None                       # one piece: no interval yet
    for piece in "bcde":
        buf.put(piece)
    assert buf.rate() == 2.0 and buf.take() == "abcde"
    assert buf.rate() == 2.0                        # taking the text keeps the count: the reply goes on
    buf.reset()
    assert buf.rate() is None and buf.take() == ""


# -- item 10: Esc and a key at once, Enter while a reply runs ----------------------------------------------------


def _terminal_keys(raw: str) -> list[Key]:
    """The key events Textual's input parser makes of `raw` arriving all at once (within its escape delay)."""
    parser = XTermParser()
    return [e for e in [*parser.feed(raw), *parser.feed("")] if isinstance(e, Key)]


async def test_esc_and_a_question_typed_at_once_stop_the_reply_and_send_the_question(store: Store) -> None:
    keys = _terminal_keys("\x1bround 2")
    assert keys[0].key == "alt+r" and keys[0].character == "r"        # the Esc is gone: that is the report
    eng = GatedEngine()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await _ask_and_hold(app, eng, pilot, "round 1")
        for ev in [*keys, *_terminal_keys("\r")]:
            app._driver.send_message(ev)                                # as the terminal driver hands them over
            await pilot.pause()
        said = " ".join(REPLY.split(" ")[:eng.before])
        eng.gate.set()                              # the next reply runs through
        await wait_until(pilot, lambda: len(store.messages(app.chat_id)) == 4 and not app.busy, timeout=30)
        assert store.messages(app.chat_id) == [("user", "round 1"), ("assistant", mark_stopped(said)),
                                               ("user", "round 2"), ("assistant", REPLY)]
        assert not [n for n in app._notifications if n.severity != "information"]    # nothing refused
        assert app.query_one(Prompt).text == ""


async def test_a_question_sent_while_a_reply_runs_waits_for_it_and_is_never_lost(store: Store) -> None:
    """Esc then Enter within the escape delay reach the app as a plain Enter (the Esc is lost): the reply goes on,
    and the question waits for it to end instead of being refused. A second one sent meanwhile stays in the box."""
    assert [k.key for k in _terminal_keys("\x1b\r")] == ["enter"]
    eng = GatedEngine()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        prompt = app.query_one(Prompt)
        await _ask_and_hold(app, eng, pilot, "round 1")
        prompt.text = "round 2"
        await pilot.press("enter")
        assert prompt.text == "" and app.busy and not app.chat_pane.cancel.is_set()     # taken; the reply goes on
        assert "waits" in str(prompt.border_title)
        prompt.text = "round 3"
        await pilot.press("enter")
        assert prompt.text == "round 3"                                  # one waits already: this one stays
        eng.gate.set()
        await wait_until(pilot, lambda: len(store.messages(app.chat_id)) == 4 and not app.busy, timeout=30)
        assert store.messages(app.chat_id) == [("user", "round 1"), ("assistant", REPLY),
                                               ("user", "round 2"), ("assistant", REPLY)]
        assert prompt.text == "round 3"                                  # not cleared by the waiting one's send
        assert not [n for n in _notes(app) if "still answering" in n]
