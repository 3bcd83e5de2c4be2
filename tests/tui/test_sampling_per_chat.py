"""Top-k, min-p, the repeat penalty and its window, max tokens per chat: F7 sets them (a bad value is one line, the
dialog keeps what was typed, nothing is saved), the subtitle shows them, the reply is asked with them (max tokens
as Engine.chat's max_tokens), the history keeps them per chat (schema 4; a schema-3 file, and a read-only one, is
upgraded with the defaults: chats sample as before); the per-chat system prompt keeps its own key (F2)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until
from textual.widgets import Input

from moeslots.engine.api import Sampling
from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.screens.sampling import FIELDS, parse_sampling
from moeslots.tui.store import SCHEMA, Store

FULL = Sampling(0.8, 0.95, 3, top_k=40, min_p=0.05, repeat_penalty=1.1, repeat_last_n=128, max_tokens=7)
IDS = ("temperature", "top-p", "top-k", "min-p", "repeat-penalty", "repeat-last-n", "max-tokens", "seed")


def _fields(app: MoeslotsApp) -> dict[str, str]:
    return {i: app.screen.query_one(f"#{i}", Input).value for i in IDS}


async def test_f7_sets_them_refuses_bad_values_with_a_line_and_sends_them(store: Store) -> None:
    eng = FakeEngine(reply="one two three four five six seven eight nine ten")
    app = MoeslotsApp(eng, store=store, model_name="m.gguf")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("f7")
        await pilot.pause()
        assert _fields(app) == {"temperature": "0", "top-p": "1", "top-k": "0", "min-p": "0", "repeat-penalty": "1",
                                "repeat-last-n": "64", "max-tokens": "", "seed": ""}
        typed = {"temperature": "0.8", "top-p": "0.95", "top-k": "40", "min-p": "0.05", "repeat-penalty": "1.1",
                 "repeat-last-n": "128", "max-tokens": "7", "seed": "3"}
        for bad, line in ((("top-k", "forty"), "top-k 'forty': type a whole number, 0 (off) or more"),
                          (("min-p", "2"), "min-p 2.0: use a number from 0 (off) to 1"),
                          (("repeat-penalty", "0.5"),
                           "repeat penalty 0.5: use a number from 1 (off) to 10, e.g. 1.1"),
                          (("repeat-last-n", "0"), "repeat window 0: use a whole number of tokens from 1 to 131072"),
                          (("max-tokens", "lots"), "max tokens 'lots': type a whole number of tokens, or leave it "
                                                   "empty for the default")):
            for i, v in {**typed, bad[0]: bad[1]}.items():
                app.screen.query_one(f"#{i}", Input).value = v
            await pilot.press("enter")
            await pilot.pause()
            assert type(app.screen).__name__ == "SamplingScreen"                    # still open ...
            assert str(app.screen.query_one("#error").render()) == f"not saved: {line}"
            assert _fields(app) == {**typed, bad[0]: bad[1]}                          # ... with what was typed
            assert store.sampling(app.chat_id) == Sampling()                          # nothing saved
        app.screen.query_one("#max-tokens", Input).value = "7"
        await pilot.press("enter")
        await pilot.pause()
        assert type(app.screen).__name__ != "SamplingScreen" and store.sampling(app.chat_id) == FULL
        assert app.sub_title == ("m.gguf · T 0.8 · top-p 0.95 · top-k 40 · min-p 0.05 · seed 3 · "
                                 "repeat 1.1 (last 128) · max 7 tokens")
        app.query_one(Prompt).text = "hi"
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.busy and len(store.messages(app.chat_id)) == 2)
        assert eng.sampling_seen[-1] == FULL and eng.max_tokens_seen[-1] == 7
        assert store.messages(app.chat_id)[-1] == ("assistant", "one two three four five six seven")
        await pilot.press("f7")                                       # shown again as saved
        await pilot.pause()
        assert _fields(app) == typed
        await pilot.press("escape")
        await pilot.pause()
        old = app.chat_id
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: app.chat_id != old)
        assert store.sampling(app.chat_id) == FULL                    # a new chat starts with them
        await pilot.press("f7")
        await pilot.pause()
        await pilot.click("#greedy")                                  # back to the defaults, this chat only
        await pilot.pause()
        assert store.sampling(app.chat_id) == Sampling() and store.sampling(old) == FULL
        assert app.sub_title == "m.gguf · greedy"
        app.query_one(Prompt).text = "again"
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.busy and len(store.messages(app.chat_id)) == 2)
        assert eng.max_tokens_seen[-1] is None                        # no limit of the chat's: the engine's own


async def test_the_system_prompt_is_per_chat_on_its_own_key(store: Store) -> None:
    """F2 shows this chat's system prompt and edits it for this chat only (F7 is sampling)."""
    a = store.new_chat("be brief")
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        assert app.chat_id == a
        await pilot.press("f2")
        await pilot.pause()
        assert app.screen.query_one(Input).value == "be brief"
        app.screen.query_one(Input).value = "be terse"
        await pilot.press("enter")
        await pilot.pause()
        b = store.new_chat("other")
        assert store.system(a) == "be terse" and store.system(b) == "other"


def test_parse_sampling_takes_empty_as_the_default() -> None:
    assert parse_sampling({}) == (Sampling(), "")
    assert parse_sampling({"temperature": "0.7", "seed": "random", "max_tokens": " "}) == (Sampling(0.7), "")
    assert parse_sampling({"top_k": "2.5"})[1] == "top-k '2.5': type a whole number, 0 (off) or more"
    assert [f.name for f in FIELDS] == ["temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n",
                                        "max_tokens", "seed"]


def test_the_history_keeps_them_per_chat(tmp_path: Path) -> None:
    p = tmp_path / "h.sqlite"
    s = Store(p)
    a, b = s.new_chat(sampling=FULL), s.new_chat()
    assert s.sampling(a) == FULL and s.sampling(b) == Sampling()
    s.set_sampling(b, Sampling(top_k=5, repeat_penalty=1.3, repeat_last_n=16))
    with pytest.raises(ValueError, match="min-p"):
        s.set_sampling(b, Sampling(min_p=3.0))
    s.close()
    s = Store(p)
    assert s.sampling(a) == FULL and s.sampling(b) == Sampling(top_k=5, repeat_penalty=1.3, repeat_last_n=16)
    s.db.execute("UPDATE chats SET top_k = 'lots' WHERE id = ?", (a,))         # a damaged row: the defaults
    assert s.sampling(a) == Sampling() and s.sampling(999) == Sampling()
    s.close()


def _schema_3(p: Path) -> None:
    db = sqlite3.connect(p)
    db.executescript("""
        CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT, system TEXT, created REAL,
            temperature REAL NOT NULL DEFAULT 0, top_p REAL NOT NULL DEFAULT 1, seed INTEGER,
            model TEXT NOT NULL DEFAULT '');
        CREATE TABLE messages (id INTEGER PRIMARY KEY, chat INTEGER REFERENCES chats(id), role TEXT, content TEXT,
            created REAL);
        INSERT INTO chats VALUES (1, 'old', 'be brief', 1.0, 0.7, 0.9, 42, 'm.gguf');
        INSERT INTO messages VALUES (1, 1, 'user', 'hello', 2.0), (2, 1, 'assistant', 'hi', 3.0);
        PRAGMA user_version = 3;
    """)
    db.close()


def test_a_schema_3_history_is_upgraded_to_4(tmp_path: Path) -> None:
    p = tmp_path / "v3.sqlite"
    _schema_3(p)
    s = Store(p)
    assert SCHEMA == 4 and s.db.execute("PRAGMA user_version").fetchone()[0] == 4
    assert s.sampling(1) == Sampling(0.7, 0.9, 42)                 # the new settings off: sampled as before
    assert s.messages(1) == [("user", "hello"), ("assistant", "hi")] and s.system(1) == "be brief"
    assert s.info(1).model == "m.gguf" and s.last_chat("m.gguf") == 1
    s.set_sampling(1, FULL)
    s.close()
    assert Store(p).sampling(1) == FULL


def test_a_read_only_schema_3_or_1_history_is_upgraded_in_memory(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """(Read-only as the store sees it, os.access, as tests/tui/test_store_faults.py does: root writes anything.)"""
    p = tmp_path / "ro.sqlite"
    _schema_3(p)
    real = os.access
    with monkeypatch.context() as mp:
        mp.setattr(os, "access", lambda f, mode, **kw: False if str(f).startswith(str(tmp_path)) and mode & os.W_OK
                   else real(f, mode, **kw))
        s = Store(p)
        assert not s.saving and s.sampling(1) == Sampling(0.7, 0.9, 42)
        s.set_sampling(1, FULL)                                     # kept in memory
        assert s.sampling(1) == FULL
        s.close()
    assert sqlite3.connect(p).execute("PRAGMA user_version").fetchone()[0] == 3      # the file untouched
    v1 = tmp_path / "v1.sqlite"
    db = sqlite3.connect(v1)
    db.executescript("""
        CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT, system TEXT, created REAL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY, chat INTEGER, role TEXT, content TEXT, created REAL);
        INSERT INTO chats VALUES (1, 't', '', 1.0);
        PRAGMA user_version = 1;
    """)
    db.close()
    s = Store(v1)                                                   # 1 -> 2 -> 3 -> 4 in one open
    assert s.db.execute("PRAGMA user_version").fetchone()[0] == 4 and s.sampling(1) == Sampling()
    s.set_sampling(1, FULL)
    assert s.sampling(1) == FULL
    s.close()
