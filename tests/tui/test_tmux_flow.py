"""End to end in tmux, a user's session: a clone-like start (`make run`: the bundled model), three questions, Ctrl+C
mid-reply stops it (marked), Esc with the next question typed at once stops the reply and sends that question
whole; the app again on the bundled model with a small context: its chat goes on past the context (said on
screen); F4 to another model (its own chat) and back to the bundled one (its chat again); a restart reopens the
bundled model's chat. The stored history is checked at the end: per model, in order, every question whole."""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import sys
import time
import uuid
from pathlib import Path

import pytest
from test_tmux_e2e import _pane, _tmux, _wait_for, _wait_idle

pytestmark = [pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed"), pytest.mark.slow]

QUESTIONS = ["What does os.path.join do?", "And os.path.split?", "Show a for loop over a list."]
LONG = ["Write a long story about experts.", "Explain the os module in detail.", "Show a long example of a class."]


def _start(session: str, home: Path, cwd: Path, args: str) -> None:
    env = (f"env -u COLUMNS -u LINES HOME={shlex.quote(str(home))} XDG_DATA_HOME={shlex.quote(str(home / 'data'))} "
           f"XDG_CONFIG_HOME={shlex.quote(str(home / 'cfg'))} TERM=xterm-256color")
    cmd = f"cd {shlex.quote(str(cwd))} && {env} {shlex.quote(sys.executable)} -m moeslots {args}; sleep 600"
    _tmux(session, "new-session", "-d", "-s", session, "-x", "150", "-y", "45", cmd, check=True)
    _tmux(session, "resize-window", "-t", session, "-x", "150", "-y", "45")


def _send(session: str, *keys: str) -> None:
    _tmux(session, "send-keys", "-t", session, *keys, check=True)


def _ask(session: str, text: str) -> None:
    _send(session, "-l", text)
    _send(session, "Enter")
    _wait_for(session, text[:30])


def _stopped(db: Path) -> list[str]:
    """The replies stored with the stop marker."""
    con = sqlite3.connect(db)
    try:
        return [t for (t,) in con.execute("SELECT content FROM messages WHERE role = 'assistant'")
                if t.rstrip().endswith("stopped*")]
    finally:
        con.close()


def _quit(session: str) -> None:
    _wait_idle(session)
    _send(session, "C-q")
    time.sleep(2)
    _tmux(session, "kill-server")


def test_a_users_session(tmp_path: Path, tiny_glm: Path) -> None:
    from moeslots.engine.machine import bundled

    home, cwd = tmp_path / "home", tmp_path / "work"
    cwd.mkdir(parents=True)
    shutil.copyfile(tiny_glm, cwd / "other.gguf")                  # another model, found by F4 in this folder
    db = home / "data" / "moeslots" / "chats.sqlite"

    s1 = f"moeslots-{uuid.uuid4().hex[:8]}"                         # make run: the bundled model, three questions
    _start(s1, home, cwd, "app --bundled")
    try:
        _wait_for(s1, "expert cache: 6 layers x 16 slots", timeout=120)
        for q in QUESTIONS:
            _ask(s1, q)
            _wait_idle(s1, timeout=120)
        for ask in LONG:                                           # Ctrl+C mid-reply (again if it ended first)
            _send(s1, "-l", ask)
            _send(s1, "Enter")
            time.sleep(0.15)                 # (the bundled model writes 512 tokens in about a second: mid-reply)
            _send(s1, "C-c")
            _wait_idle(s1, timeout=60)
            if _stopped(db):
                break
        else:
            raise AssertionError(f"Ctrl+C never stopped a reply; pane:\n{_pane(s1)}")
        _send(s1, "-l", "Another long story, please.")            # Esc and the next question at once
        _send(s1, "Enter")
        time.sleep(0.15)
        _send(s1, "Escape", "short one")                          # (one write: the Esc and the text back to back)
        _send(s1, "Enter")
        _wait_for(s1, "short one")
        _wait_idle(s1, timeout=120)
    finally:
        _quit(s1)

    s2 = f"moeslots-{uuid.uuid4().hex[:8]}"                         # a small context: the chat outgrows it
    _start(s2, home, cwd, f"chat {shlex.quote(str(bundled.model()))} --ctx 320")
    try:
        _wait_for(s2, "expert cache: 6 layers x 16 slots", timeout=120)
        _wait_for(s2, "— moeslots-tiny-glm4moe.gguf")              # its own last chat, continued (checked below)
        for i in range(4):
            _ask(s2, f"Tell me more, part {i}.")
            _wait_idle(s2, timeout=120)
            if "no longer fit" in _pane(s2) or "no longer sees them" in _pane(s2):
                break
        else:
            raise AssertionError(f"the context never filled; pane:\n{_pane(s2)}")
        _send(s2, "F4")                                            # another model: its own chat
        _wait_for(s2, "other.gguf")
        time.sleep(0.5)
        _send(s2, "Down")
        _send(s2, "Enter")
        _wait_for(s2, "switched to other.gguf", timeout=120)
        _ask(s2, "Hello other model.")
        _wait_idle(s2, timeout=120)
        _send(s2, "F4")                                            # and back to the bundled model's chat
        _wait_for(s2, "moeslots-tiny-glm4moe.gguf (bundled)")
        time.sleep(0.5)
        _send(s2, "Enter")
        _wait_for(s2, "switched to moeslots-tiny-glm4moe.gguf: its last chat", timeout=120)
    finally:
        _quit(s2)

    s3 = f"moeslots-{uuid.uuid4().hex[:8]}"                         # restart: the last model and its chat
    _start(s3, home, cwd, "")
    try:
        _wait_for(s3, "expert cache: 6 layers x 16 slots", timeout=120)
        _wait_for(s3, "— moeslots-tiny-glm4moe.gguf")            # the last model used, in the title bar
    finally:
        _quit(s3)

    con = sqlite3.connect(db)
    try:
        chats = con.execute("SELECT id, model FROM chats ORDER BY id").fetchall()
        mine = [c for c, m in chats if m == bundled.model().name]
        other = [c for c, m in chats if m == "other.gguf"]
        assert len(mine) == 1 and len(other) == 1, chats             # one chat per model, not mixed
        rows = con.execute("SELECT role, content FROM messages WHERE chat = ? ORDER BY id", (mine[0],)).fetchall()
        asked = [t for r, t in rows if r == "user"]
        assert asked[:3] == QUESTIONS, asked                                     # in order, each whole, once
        i = asked.index("short one")                  # sent whole after the Esc (the question stopped before, or
        assert asked[i + 1].startswith("Tell me more"), asked    # given back and replaced if nothing was said yet)
        assert len(asked) == len(set(asked)), asked
        roles = [r for r, _ in rows]
        assert roles == ["user", "assistant"] * (len(rows) // 2), roles          # every question answered
        stopped = [t for r, t in rows if r == "assistant" and t.rstrip().endswith("stopped*")]
        assert stopped, "no reply is marked as stopped"
        said = [t for r, t in con.execute("SELECT role, content FROM messages WHERE chat = ?", (other[0],))]
        assert said and said[0] == "Hello other model."
    finally:
        con.close()
    assert os.path.exists(db)
