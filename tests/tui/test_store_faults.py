"""A history file that fails never stops the chat nor loses a typed question: a full disk mid-session (the write of
the question or of the reply refused: one notice, the chat goes on in memory, the question stays in the prompt
box), a read-only history (opened read-only, one notice, chatting works, nothing written), a damaged file (moved
aside to chats.sqlite.damaged-<time>, a fresh history, one notice). The app tests simulate the full disk with a
connection whose writes fail as SQLite's do; the store tests run the real thing in a Python of their own: a file
size limit (RLIMIT_FSIZE) and permission bits (as root: with the capabilities that bypass them dropped). Each test
failed on the store before this change (a traceback, the question cleared, or the file written anyway)."""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until

from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.store import Store

SIZE = (140, 40)


async def _wait(pilot: Any, cond: Any) -> None:
    await wait_until(pilot, cond, timeout=60.0, step=0.05)      # generous: a busy 2-core machine


def _notes(app: MoeslotsApp, needle: str) -> list[str]:
    return [str(n.message) for n in app._notifications if needle in str(n.message)]


def _on_disk(path: Path) -> list[tuple[str, str]]:
    """The messages the file itself holds (read past the store)."""
    db = sqlite3.connect(path)
    try:
        return [(r, c) for r, c in db.execute("SELECT role, content FROM messages ORDER BY id")]
    finally:
        db.close()


def _history(path: Path) -> None:
    """A history with one answered chat."""
    s = Store(path)
    chat = s.new_chat()
    s.add(chat, "user", "old question")
    s.add(chat, "assistant", "old answer")
    s.close()


class FullDisk:
    """The store's connection on a full disk: reads work, every write fails as SQLite reports it."""

    WRITES = ("INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "PRAGMA USER_VERSION =")

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql.lstrip().upper().startswith(self.WRITES):
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def __enter__(self) -> sqlite3.Connection:
        return self._db.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._db.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:               # backup, rollback, close: the real connection's
        return getattr(self._db, name)


class GatedEngine(FakeEngine):
    """Answers only once `gate` is set: the test changes the disk between the question's write and the reply's."""

    def __init__(self) -> None:
        super().__init__(reply="an answer kept in memory")
        self.gate = threading.Event()

    def chat(self, messages: Any, cancel: Any = None, sampling: Any = None) -> Iterator[Any]:
        self.gate.wait(120)
        yield from super().chat(messages, cancel=cancel, sampling=sampling)


# -- the app: a full disk mid-session --------------------------------------------------------------------------


async def test_a_full_disk_keeps_the_typed_question_in_the_prompt(store: Store) -> None:
    """The question's write fails: not sent, still in the box, one notice; Enter sends it again (in memory)."""
    eng = FakeEngine(reply="answered from memory")
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=SIZE) as pilot:
        store.db = FullDisk(store.db)            # type: ignore[assignment]
        app.query_one(Prompt).text = "what is a slot?"
        await pilot.press("enter")
        await _wait(pilot, lambda: _notes(app, "chats go on in memory"))
        assert app.query_one(Prompt).text == "what is a slot?"      # the typed question is not lost
        assert not eng.seen and not app.busy                  # nor sent half-saved
        assert len(_notes(app, "chats go on in memory")) == 1
        assert "still in the prompt box" in _notes(app, "chats go on in memory")[0]
        await pilot.press("enter")                                   # again: the chat goes on in memory
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 2 and not app.busy)
        assert store.messages(app.chat_id) == [("user", "what is a slot?"), ("assistant", "answered from memory")]
        assert app.query_one(Prompt).text == ""
        assert len(_notes(app, "chat history")) == 1                 # said once
        assert app.is_running
    assert _on_disk(store.path) == []                                # nothing half-written on the disk


async def test_a_full_disk_when_the_reply_is_saved_keeps_it_in_memory(store: Store) -> None:
    """The question saved, the reply's write fails: the reply stays on screen and in the (memory) history, one
    notice, the next question works."""
    eng = GatedEngine()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=SIZE) as pilot:
        app.query_one(Prompt).text = "first"
        await pilot.press("enter")
        await _wait(pilot, lambda: store.messages(app.chat_id) == [("user", "first")] and app.busy)
        store.db = FullDisk(store.db)            # type: ignore[assignment]
        eng.gate.set()
        await _wait(pilot, lambda: not app.busy)
        assert store.messages(app.chat_id) == [("user", "first"), ("assistant", eng.reply)]
        assert not store.saving and len(_notes(app, "chats go on in memory")) == 1
        app.query_one(Prompt).text = "second"
        await pilot.press("enter")
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 4 and not app.busy)
        assert len(list(app.query("ChatMessage"))) == 4 and len(_notes(app, "chat history")) == 1
        assert app.is_running
    assert _on_disk(store.path) == [("user", "first")]


# -- the app: read-only and damaged histories ------------------------------------------------------------------


async def test_a_read_only_history_opens_read_only_and_chats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its chats shown, one notice, a question answered; the file untouched. (Read-only as the store sees it:
    os.access; the real permission bits: test_read_only_files_and_folders_for_real below.)"""
    path = tmp_path / "chats.sqlite"
    _history(path)
    before = path.read_bytes()
    real = os.access
    monkeypatch.setattr(os, "access",
                        lambda p, mode, **kw: False if str(p).startswith(str(tmp_path)) and mode & os.W_OK
                        else real(p, mode, **kw))
    store = Store(path)
    app = MoeslotsApp(FakeEngine(reply="fine"), store=store)
    async with app.run_test(size=SIZE) as pilot:
        await _wait(pilot, lambda: _notes(app, "read-only") and app.query("ChatMessage"))
        assert len(list(app.query("ChatMessage"))) == 2                   # the old chat is there
        assert len(_notes(app, "read-only")) == 1
        app.query_one(Prompt).text = "new question"
        await pilot.press("enter")
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 4 and not app.busy)
        assert app.query_one(Prompt).text == "" and len(_notes(app, "chat history")) == 1
    assert path.read_bytes() == before


async def test_a_damaged_history_is_moved_aside_and_a_fresh_one_starts(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite"
    junk = random.Random(7).randbytes(16384)
    path.write_bytes(junk)
    store = Store(path)
    app = MoeslotsApp(FakeEngine(reply="fresh"), store=store)
    async with app.run_test(size=SIZE) as pilot:
        await _wait(pilot, lambda: _notes(app, "chat history"))
        [note] = _notes(app, "chat history")
        [aside] = list(tmp_path.glob("chats.sqlite.damaged-*"))
        assert re.fullmatch(r"chats\.sqlite\.damaged-\d{8}-\d{6}", aside.name) and aside.name in note
        assert aside.read_bytes() == junk
        app.query_one(Prompt).text = "hello"
        await pilot.press("enter")
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 2 and not app.busy)
    assert _on_disk(path) == [("user", "hello"), ("assistant", "fresh")]        # saved in the fresh file


def test_damage_past_the_header_is_found_at_start(tmp_path: Path) -> None:
    """A valid header over damaged pages (reads would fail mid-chat): moved aside when opened."""
    path = tmp_path / "chats.sqlite"
    s = Store(path)
    for i in range(40):
        s.add(s.new_chat(), "user", f"question {i} " + "x" * 400)
    s.close()
    data = bytearray(path.read_bytes())
    data[4096:] = random.Random(3).randbytes(len(data) - 4096)
    path.write_bytes(bytes(data))
    s = Store(path)
    assert len(list(tmp_path.glob("chats.sqlite.damaged-*"))) == 1
    assert s.saving and s.chats() == [] and "moved aside" in s.take_notices()[0]


# -- the store under real conditions, in a Python of its own ---------------------------------------------------

_DROP = """import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for cap in (1, 2):          # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: out of the bounding set, gone after exec
    if libc.prctl(24, cap, 0, 0, 0) != 0:
        sys.exit(77)
os.execv(sys.executable, [sys.executable, "-c", CODE, *sys.argv[1:]])
"""

_CHILD = """import json, resource, sys
from pathlib import Path
from moeslots.tui.store import Store
path, full = Path(sys.argv[1]), sys.argv[2] == "full"
try:
    s = Store(path)
except Exception as e:      # (HistoryError: the test checks which)
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
    sys.exit(0)
notes = getattr(s, "take_notices", list)      # (the store before these notices: none)
out = {"notices": notes()}
chat = s.last_chat() or s.new_chat()
if full:                    # the file may not grow: the next write fails as on a full disk
    size = path.stat().st_size
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
s.add(chat, "user", "new question " + "x" * 20000)
out["notices_after_question"] = notes()
s.add(chat, "assistant", "new answer")
out.update(saving=getattr(s, "saving", True), messages=s.messages(chat), notices_later=notes())
print(json.dumps(out))
"""


def _child(path: Path, full: bool = False) -> dict[str, Any]:
    """_CHILD on `path` in a Python that the permission bits bind (tests run as root in a container: it starts
    without the capabilities that bypass them)."""
    code = _CHILD if os.geteuid() != 0 else f"CODE = {_CHILD!r}\n" + _DROP
    r = subprocess.run([sys.executable, "-c", code, str(path), "full" if full else "-"], capture_output=True,
                       text=True, timeout=300)
    if r.returncode == 77:
        pytest.skip("cannot drop CAP_DAC_OVERRIDE here: root ignores the permission bits")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


@pytest.fixture()
def ro_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "history"
    d.mkdir()
    yield d
    d.chmod(0o755)                                    # (so pytest can remove it)


@pytest.mark.parametrize("case", ["folder", "file", "no-file"])
def test_read_only_files_and_folders_for_real(ro_dir: Path, case: str) -> None:
    """A read-only folder (with or without a history) or a read-only file: opened read-only, one notice, the old
    chat read, new messages kept in memory, the file untouched."""
    path = ro_dir / "chats.sqlite"
    if case != "no-file":
        _history(path)
        path.chmod(0o444 if case == "file" else 0o644)
    before = path.read_bytes() if path.exists() else None
    if case != "file":
        ro_dir.chmod(0o555)
    out = _child(path)
    assert out.get("error") is None and not out["saving"] and len(out["notices"]) == 1
    assert ("read-only" if case != "no-file" else "cannot be written") in out["notices"][0]
    old = [["user", "old question"], ["assistant", "old answer"]] if case != "no-file" else []
    assert out["messages"][:len(old)] == old and out["messages"][-1] == ["assistant", "new answer"]
    assert out["notices_after_question"] == out["notices_later"] == []            # said once, at start
    assert (path.read_bytes() if path.exists() else None) == before


def test_a_damaged_file_in_a_read_only_folder_is_one_line(ro_dir: Path) -> None:
    path = ro_dir / "chats.sqlite"
    path.write_bytes(random.Random(5).randbytes(8192))
    ro_dir.chmod(0o555)
    err = _child(path)["error"]
    assert err.startswith("HistoryError: ") and str(path) in err and "\n" not in err
    assert "damaged" in err and "move it aside" in err


def test_a_full_filesystem_mid_session(tmp_path: Path) -> None:
    """The file may not grow (RLIMIT_FSIZE: EFBIG, as a full disk): one notice, the history goes on in memory with
    everything; the file keeps its old chat, intact. (The question kept in the box: the app tests above.)"""
    path = tmp_path / "chats.sqlite"
    _history(path)
    out = _child(path, full=True)
    assert out["notices"] == [] and not out["saving"]
    [note] = out["notices_after_question"]
    assert str(path) in note and "in memory" in note and out["notices_later"] == []
    assert [m[0] for m in out["messages"]] == ["user", "assistant", "user", "assistant"]
    assert out["messages"][:2] == [["user", "old question"], ["assistant", "old answer"]]
    assert out["messages"][-1] == ["assistant", "new answer"] and out["messages"][-2][1].startswith("new question")
    assert _on_disk(path) == [("user", "old question"), ("assistant", "old answer")]
    assert Store(path).take_notices() == []                                       # not damaged by the failure

