"""Snapshots of the chat and the inspector drawn from the scripted fake engine (deterministic data)."""

from __future__ import annotations

from pathlib import Path

from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)

from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.store import Store


def _app(tmp_path: Path) -> MoeslotsApp:
    store = Store(tmp_path / "snap.sqlite")
    chat = store.new_chat()
    store.add(chat, "user", "explain the LRU policy in two lines")
    store.add(chat, "assistant", "An **LRU** cache evicts the entry used least recently.\n\nIt bets that what was used "
                                 "a moment ago will be used again soon.")
    return MoeslotsApp(FakeEngine(), store=store, model_name="fake-moe.gguf")


async def _settle(pilot) -> None:  # noqa: ANN001
    pilot.app.query_one(Prompt).cursor_blink = False
    await pilot.pause(0.5)


def test_chat_and_inspector(snap_compare, tmp_path: Path) -> None:  # noqa: ANN001
    assert snap_compare(_app(tmp_path), terminal_size=(140, 36), run_before=_settle)


def test_narrow_terminal(snap_compare, tmp_path: Path) -> None:  # noqa: ANN001
    assert snap_compare(_app(tmp_path), terminal_size=(80, 24), run_before=_settle)
