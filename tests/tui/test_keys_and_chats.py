"""Issue 22, keys and chats: F1 shows the app's keys (F1 or Esc closes it), every key has an id the keymap rebinds
(a bad [keymap] entry is one warning), app keys leave a dialog's fields alone, confirmations have buttons, the
chat list opens, renames, deletes and searches old chats, each chat has its sampling settings, and the history
store upgrades a schema-1 file in place. Each app test failed on the code before the fix."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until
from textual.widgets import Button, DataTable, Input

from moeslots.engine.api import Sampling
from moeslots.tui import keys
from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.store import Store

_wait = wait_until


def _screen(app: MoeslotsApp) -> str:
    return type(app.screen).__name__


async def test_f1_shows_the_app_keys_and_f1_or_esc_closes_them(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store, keymap={"slots": "f10"})
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        assert _screen(app) == "HelpScreen"
        table = app.screen.table
        rows = [(str(a), str(b)) for a, b in zip(table.columns[0]._cells, table.columns[1]._cells)]
        assert rows[1][0] == "Enter" and ("F10", keys.GROUPS[1][1][0][2]) in rows       # the keys bound now
        assert ("F5", "answer the last question again (with this chat's sampling)") in rows
        await pilot.press("f1")
        await pilot.pause()
        assert _screen(app) == "MainScreen"
        await pilot.press("f1")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert _screen(app) == "MainScreen"


async def test_every_key_is_rebindable_and_a_bad_keymap_is_one_warning(store: Store) -> None:
    assert all(b.id for b in keys.BINDINGS) and len(keys.IDS) == len(keys.BINDINGS)
    app = MoeslotsApp(FakeEngine(), store=store, keymap={"chats": "f9", "regenerate": "ctrl+g", "nope": "f12"})
    async with app.run_test(size=(140, 40)) as pilot:
        warned = [str(n.message) for n in app._notifications if n.severity == "warning"]
        assert warned == ["[keymap] nope: no such key binding (known: " + ", ".join(sorted(keys.IDS)) + ")"]
        await pilot.press("f9")
        await pilot.pause()
        assert _screen(app) == "ChatsScreen"


async def test_app_keys_leave_a_dialogs_fields_alone(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("f2")                                   # the system prompt dialog: a text field
        await pilot.pause()
        await pilot.press(*"be terse", "ctrl+s", "ctrl+l", "ctrl+n")
        await pilot.pause()
        assert _screen(app) == "NameScreen" and app.screen.query_one(Input).value == "be terse"
        await pilot.press("enter")
        await pilot.pause()
        assert store.system(app.chat_id) == "be terse"


async def test_confirmations_have_buttons(store: Store, tmp_path: Path) -> None:
    eng = FakeEngine()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("ctrl+r")
        await pilot.pause(0.2)
        await pilot.press("ctrl+r")
        await pilot.pause()
        app.screen.query_one(Input).value = str(tmp_path / "p.csv")
        await pilot.press("enter")
        await _wait(pilot, lambda: _screen(app) == "ConfirmScreen")
        assert [str(b.label) for b in app.screen.query(Button)] == ["Apply", "Not now"]
        await pilot.press("n")
        await pilot.pause()
        assert _screen(app) == "MainScreen" and eng.profile == Path("fake-profile.csv")     # not applied


async def test_the_chat_list_opens_renames_deletes_and_searches(store: Store) -> None:
    ids = []
    for title, q in (("lru", "explain the LRU policy"), ("heat", "what does the heatmap show"),
                     ("mtp", "what is MTP drafting")):
        c = store.new_chat()
        store.add(c, "user", q)
        store.add(c, "assistant", f"an answer about {title}")
        ids.append(c)
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        assert app.chat_id == ids[-1]
        await pilot.press("ctrl+l")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        assert table.row_count == 3 and str(table.get_row_at(0)[1]) == "what is MTP drafting"   # newest first
        await pilot.press(*"heatmap")                             # search titles and messages
        await pilot.pause()
        assert table.row_count == 1
        await pilot.press("enter")                                # open it
        await _wait(pilot, lambda: app.chat_id == ids[1])
        assert [m.text for m in app.query("ChatMessage")][0] == "what does the heatmap show"
        await pilot.press("ctrl+l")
        await pilot.pause()
        await pilot.press("down", "f2")                           # to the list, rename the open chat
        await pilot.pause()
        app.screen.query_one(Input).value = "Heatmap questions"
        await pilot.press("enter")
        await pilot.pause()
        assert store.info(ids[1]).title == "Heatmap questions"
        await pilot.press("delete")                               # delete it: a Yes/No with buttons
        await pilot.pause()
        assert _screen(app) == "ConfirmScreen"
        await pilot.press("y")
        await pilot.pause()
        assert not store.exists(ids[1]) and len(store.chats()) == 2
        await pilot.press("escape")
        await _wait(pilot, lambda: app.chat_id not in ids)        # the open chat went: a new one
        assert app.query("#welcome") and store.messages(ids[0])   # the others are kept


async def test_sampling_is_set_per_chat_and_sent(store: Store) -> None:
    eng = FakeEngine()
    app = MoeslotsApp(eng, store=store, model_name="m.gguf")
    async with app.run_test(size=(140, 40)) as pilot:
        assert app.sub_title == "m.gguf · greedy"
        await pilot.press("f7")
        await pilot.pause()
        for wid, v in (("#temperature", "hot"), ("#top-p", "0.9"), ("#seed", "42")):
            app.screen.query_one(wid, Input).value = v
        await pilot.press("enter")
        await pilot.pause()
        assert str(app.screen.query_one("#error").render()) == ("not saved: temperature 'hot': type a number from 0 "
                                                                "(greedy) to 5")
        app.screen.query_one("#temperature", Input).value = "0.7"
        await pilot.press("enter")
        await pilot.pause()
        assert store.sampling(app.chat_id) == Sampling(0.7, 0.9, 42)
        assert app.sub_title == "m.gguf · T 0.7 · top-p 0.9 · seed 42"
        app.query_one(Prompt).text = "hi"
        await pilot.press("enter")
        await _wait(pilot, lambda: not app.busy and len(store.messages(app.chat_id)) == 2)
        assert eng.sampling_seen[-1] == Sampling(0.7, 0.9, 42)
        old = app.chat_id
        await pilot.press("ctrl+n")
        await _wait(pilot, lambda: app.chat_id != old)
        assert store.sampling(app.chat_id) == Sampling(0.7, 0.9, 42)          # a new chat starts with them
        await pilot.press("f7")
        await pilot.pause()
        await pilot.click("#greedy")
        await pilot.pause()
        assert store.sampling(app.chat_id) == Sampling() and store.sampling(old) == Sampling(0.7, 0.9, 42)


def test_a_schema_1_history_is_upgraded_in_place(tmp_path: Path) -> None:
    p = tmp_path / "old.sqlite"
    db = sqlite3.connect(p)
    db.executescript("""
        CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT, system TEXT, created REAL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY, chat INTEGER REFERENCES chats(id), role TEXT, content TEXT,
            created REAL);
        INSERT INTO chats VALUES (1, '100% _odd_ title', 'be brief', 1.0);
        INSERT INTO messages VALUES (1, 1, 'user', 'hello', 2.0), (2, 1, 'assistant', 'hi', 3.0);
        PRAGMA user_version = 1;
    """)
    db.close()
    s = Store(p)
    assert s.messages(1) == [("user", "hello"), ("assistant", "hi")] and s.system(1) == "be brief"
    assert s.sampling(1) == Sampling() and s.db.execute("PRAGMA user_version").fetchone()[0] == 4
    assert s.info(1).model == ""                                   # made before chats kept their model
    assert [c.id for c in s.chats("100%")] == [1] and s.chats("1%0") == []
    assert s.chats("_odd_") != [] and s.chats("o_d") == []
    s.set_sampling(1, Sampling(1.0, 0.5, 3))
    with pytest.raises(ValueError, match="top-p"):
        s.set_sampling(1, Sampling(1.0, 5.0))
    with pytest.raises(ValueError, match="empty"):
        s.rename(1, "   ")
    s.close()
    assert Store(p).sampling(1) == Sampling(1.0, 0.5, 3)
