"""The app is built by composition, and stays so: the App is Textual's App with no mixins of ours; the chat pane is
a widget that owns the reply's state (a reactive the prompt box follows) and posts ReplyDone, which the App
handles; switching models runs as a Textual worker and posts EngineSwitched; a worker thread's notice reaches the
App as a Notice message; no part writes the App's fields (a dialog once wrote the app's private flags); the inspector
owns its refresh timer and the heatmap its hover. A reply does not leave Textual widgets behind (each bindings
refresh made the Footer recompose, and its old keys were never freed: the soak's memory grew with every reply).

Nothing here depends on how fast the box runs: the tests wait for states, not for times."""

from __future__ import annotations

import ast
import gc
import threading
from pathlib import Path
from typing import Any

from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until
from textual.app import App
from textual.message import Message
from textual.reactive import Reactive
from textual.widget import Widget
from textual.widgets import Static
from textual.widgets._footer import FooterKey
from textual.worker import get_current_worker

from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.chatpane import ChatPane
from moeslots.tui.inspector import Inspector
from moeslots.tui.messages import EngineSwitched, Notice, ReplyDone
from moeslots.tui.modelswitch import SWITCH_WORKER
from moeslots.tui.store import Store
from moeslots.tui.stream import ReplyBuffer
from moeslots.tui.widgets.heatmap import SlotHeatmap

TUI = Path(__file__).resolve().parents[2] / "tui"


async def _reply(app: MoeslotsApp, pilot: Any, store: Store, text: str) -> None:
    """Sends `text` and waits until its reply is in the history and the pane is idle again."""
    n = len(store.messages(app.chat_id))
    app.query_one(Prompt).text = text
    await pilot.press("enter")
    await wait_until(pilot, lambda: len(store.messages(app.chat_id)) == n + 2 and not app.busy, timeout=30)


def test_the_app_is_textuals_app_without_mixins() -> None:
    ours = [c for c in MoeslotsApp.__mro__ if c.__module__.startswith("moeslots")]
    assert ours == [MoeslotsApp]
    assert MoeslotsApp.__bases__ == (App,)


def test_no_part_of_the_app_writes_the_apps_fields() -> None:
    """Outside tui/app.py nothing assigns to `app.x` / `self.app.x` or setattr()s the app: parts post messages.
    (tui/appbench.py is left out: it drives the app from outside, as a test does.)"""
    found = []
    for f in sorted(TUI.rglob("*.py")):
        if f.parent == TUI and f.name in ("app.py", "appbench.py"):
            continue
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AugAssign,
                                                                                                ast.AnnAssign)) else []
            for t in targets:
                for x in [t, *(t.elts if isinstance(t, ast.Tuple) else [])]:
                    if isinstance(x, ast.Attribute) and ast.unparse(x.value).split(".")[-1] == "app":
                        found.append(f"{f.name}:{x.lineno} {ast.unparse(x)}")
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr" and n.args
                    and ast.unparse(n.args[0]).split(".")[-1] == "app"):
                found.append(f"{f.name}:{n.lineno} {ast.unparse(n)}")
    assert found == []


async def test_the_chat_pane_owns_the_reply_and_posts_reply_done(store: Store) -> None:
    seen: list[type[Message]] = []
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40), message_hook=lambda m: seen.append(type(m))) as pilot:
        pane = app.chat_pane
        assert isinstance(pane, ChatPane) and isinstance(pane, Widget) and pane.parent is not None
        assert isinstance(pane.reply, ReplyBuffer) and not any(isinstance(v, ReplyBuffer) for v in vars(app).values())
        assert isinstance(vars(ChatPane)["state"], Reactive)                  # the reply's state: a reactive
        states: list[str] = []
        app.watch(pane, "state", lambda s: states.append(s), init=False)
        await _reply(app, pilot, store, "hi")
        assert ReplyDone in seen                                               # posted by the pane ...
        assert app.last_turn is not None and app.last_turn.tokens > 0          # ... and handled by the App
        assert states[0] == "answering" and states[-1] == "" and pane.prompt.border_title == ""
        assert "on_reply_done" in vars(MoeslotsApp) and "on_reply_done" in vars(ChatPane)


async def test_the_model_switch_is_a_worker_that_posts_engine_switched(store: Store, tmp_path: Path) -> None:
    class Closing(FakeEngine):
        closed = False

        def close(self) -> None:
            self.closed = True

    ran_in: list[tuple[str, object, bool]] = []
    go = threading.Event()

    def opener(path: Path, progress: object = None) -> FakeEngine:
        w = get_current_worker()                         # raises outside a Textual worker
        ran_in.append((w.name, w.node, threading.current_thread() is threading.main_thread()))
        go.wait(20)
        return Closing()

    seen: list[type[Message]] = []
    old = Closing()
    app = MoeslotsApp(old, store=store, model_name="a.gguf")
    app.model_path, app.opener = tmp_path / "a.gguf", opener
    async with app.run_test(size=(140, 40), message_hook=lambda m: seen.append(type(m))) as pilot:
        app.switch_model(tmp_path / "b.gguf")
        await wait_until(pilot, lambda: bool(ran_in), timeout=20)
        assert ran_in == [(SWITCH_WORKER, app, False)]               # the App's worker, on a thread of its own
        assert [w.name for w in app.workers if w.is_running] == [SWITCH_WORKER]
        assert app.busy and app.switching and old.closed
        go.set()
        await wait_until(pilot, lambda: app.model_path == tmp_path / "b.gguf", timeout=20)
        assert EngineSwitched in seen and not app.busy and isinstance(app.engine, Closing) and app.engine is not old
        await wait_until(pilot, lambda: not any(w.name == SWITCH_WORKER and w.is_running for w in app.workers))


async def test_a_worker_threads_notice_is_a_message_to_the_app(store: Store) -> None:
    seen: list[type[Message]] = []
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40), message_hook=lambda m: seen.append(type(m))) as pilot:
        app.engine_actions.apply_slots("99")                 # the fake engine refuses 99 slots, on a worker thread
        await wait_until(pilot, lambda: any("slots unchanged" in n.message for n in app._notifications))
        assert Notice in seen


async def test_the_inspector_owns_its_refresh_timer(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        inspector = app.inspector
        assert isinstance(inspector, Inspector) and inspector.parent is not None
        assert any(t._callback == inspector.poll and t._repeat is None for t in inspector._timers)   # forever
        others = [t for node in (app, app.screen, app.chat_pane) for t in node._timers]
        assert not [t for t in others if getattr(t._callback, "__self__", None) is inspector]


async def test_the_heatmap_owns_its_hover(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        hm = app.query_one(SlotHeatmap)
        hm.post_message(SlotHeatmap.Hovered("layer 1 · slot 0"))        # what its mouse-move handler posts
        await wait_until(pilot, lambda: "layer 1 · slot 0" in str(app.query_one("#hover", Static).render()))
        assert "on_mouse_move" in vars(SlotHeatmap)
        assert not [n for n in vars(MoeslotsApp) if n.startswith("on_mouse") or "hover" in n]


async def test_replies_leave_no_footer_keys_behind(store: Store) -> None:
    """Each reply changes the pane's state three or four times: the Footer must not recompose for it (its old keys
    stay bound to it, never freed)."""
    app = MoeslotsApp(FakeEngine(), store=store)

    def footer_keys() -> int:
        gc.collect()
        return sum(isinstance(o, FooterKey) for o in gc.get_objects())

    async with app.run_test(size=(140, 40)) as pilot:
        await _reply(app, pilot, store, "first")
        before = footer_keys()
        for i in range(6):
            await _reply(app, pilot, store, f"question {i}")
        assert footer_keys() == before
