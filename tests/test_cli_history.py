"""`moeslots chat` and a history or model file that cannot be used: what the history store cannot handle at start-up
(a folder where the file goes, a newer schema) is one line on stderr and exit code 2, the engine closed; a damaged
history is moved aside and the app starts with a notice; an empty model file is named as empty (not as b'').
Each test failed before: a traceback (sqlite3.OperationalError, RuntimeError, DatabaseError) or "starts with b''"."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeEngine  # (tests/ is on sys.path)
from test_cli import _one_line_error, run

from moeslots import cli
from moeslots.cli import chat
from moeslots.tui.app import MoeslotsApp


class ClosingEngine(FakeEngine):
    closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture()
def history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where `moeslots chat` keeps its history in this test; the engine a fake, the app not run (its store kept)."""
    def engine(model: Path, a: Any, **kw: Any) -> ClosingEngine:
        ENGINES.append(ClosingEngine())
        return ENGINES[-1]

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setattr(chat, "chat_engine", engine)
    monkeypatch.setattr(MoeslotsApp, "run", lambda self, *a, **kw: RAN.append(self))
    ENGINES.clear()
    RAN.clear()
    p = tmp_path / "data" / "moeslots" / "chats.sqlite"
    p.parent.mkdir(parents=True)
    return p


ENGINES: list[ClosingEngine] = []
RAN: list[Any] = []


def _error_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    assert code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("moeslots: error: "), lines
    assert not RAN and ENGINES and ENGINES[-1].closed          # the app never started, the engine was closed
    return lines[0]


def test_a_folder_where_the_history_goes_is_one_line(history: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history.mkdir()
    line = _error_line(capsys, cli.main(["chat", "m.gguf"]))
    assert str(history) in line and "move the file aside" in line


def test_a_history_of_a_newer_moeslots_is_one_line(history: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = sqlite3.connect(history)
    db.execute("PRAGMA user_version = 9")
    db.close()
    line = _error_line(capsys, cli.main(["chat", "m.gguf"]))
    assert str(history) in line and "newer moeslots" in line and "update moeslots" in line


def test_a_damaged_history_is_moved_aside_and_the_app_starts(history: Path) -> None:
    history.write_bytes(b"not a database, " * 512)
    assert cli.main(["chat", "m.gguf"]) == 0
    [app] = RAN
    [note] = app.store.notices
    [aside] = list(history.parent.glob("chats.sqlite.damaged-*"))
    assert aside.name in note and aside.read_bytes() == b"not a database, " * 512
    assert app.store.saving and history.exists()


def test_an_empty_model_file_says_it_is_empty(tmp_path: Path) -> None:
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    r = run("chat", str(p))
    _one_line_error(r, "empty.gguf", "empty (0 bytes)")
    assert "b''" not in r.stderr
