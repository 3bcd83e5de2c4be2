"""End to end: the real app (`moeslots`, the bundled model) in tmux: a reply appears, the load line and the
heatmap rows appear, changing the slots works, and a fast storm of questions, Esc and Enter leaves a history of
whole questions, each once, each answered."""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")


def _tmux(session: str, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    """tmux on a private server (-L): a server left by another run would hand us its stale environment."""
    return subprocess.run(["tmux", "-L", session, "-f", "/dev/null", *args], capture_output=True, text=True, **kw)


def _pane(session: str) -> str:
    return _tmux(session, "capture-pane", "-t", session, "-p").stdout


def _wait_for(session: str, needle: str, timeout: float = 60) -> str:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        text = _pane(session)
        if needle in text:
            return text
        time.sleep(0.3)
    raise AssertionError(f"{needle!r} did not appear; pane:\n{_pane(session)}")


def _wait_still(session: str, quiet: float = 2.0, timeout: float = 60) -> None:
    """Wait until the chat side of the pane stops changing (the inspector refreshes on its own)."""
    t0 = time.monotonic()
    last, since = None, time.monotonic()
    while time.monotonic() - t0 < timeout:
        chat = "\n".join(line[:80] for line in _pane(session).splitlines())
        if chat != last:
            last, since = chat, time.monotonic()
        elif time.monotonic() - since > quiet:
            return
        time.sleep(0.2)
    raise AssertionError("the reply never finished")


def test_app_in_tmux(tmp_path: Path) -> None:
    session = f"moeslots-{uuid.uuid4().hex[:8]}"
    env = (f"env -u COLUMNS -u LINES XDG_DATA_HOME={shlex.quote(str(tmp_path / 'data'))} "
           f"XDG_CONFIG_HOME={shlex.quote(str(tmp_path / 'cfg'))} TERM=xterm-256color")
    cmd = f"cd {shlex.quote(os.getcwd())} && {env} {shlex.quote(sys.executable)} -m moeslots; sleep 5"
    _tmux(session, "new-session", "-d", "-s", session, "-x", "150", "-y", "45", cmd, check=True)
    _tmux(session, "resize-window", "-t", session, "-x", "150", "-y", "45")
    try:
        # the bundled model with its merged profile, a quarter of its 64 experts in slots
        _wait_for(session, "expert cache: 6 layers x 16 slots", timeout=120)
        _tmux(session, "send-keys", "-t", session, "What does `os.path.join` do?", "Enter", check=True)
        text = _wait_for(session, "assistant ▸")
        _wait_for(session, "what-if @16")                     # the inspector drew the simulator line
        text = _pane(session)
        assert "L01" in text and "L06" in text and "miss" in text
        _wait_still(session)                                   # the reply has finished
        _tmux(session, "send-keys", "-t", session, "C-s", check=True)
        _wait_for(session, "Slots per layer")
        time.sleep(0.5)
        for key in ("C-u", "4", "Enter"):
            _tmux(session, "send-keys", "-t", session, key, check=True)
            time.sleep(0.3)
        _wait_for(session, "x 4 slots")
        _storm(session, random.Random(7))
        _wait_still(session)
        _tmux(session, "send-keys", "-t", session, "C-q", check=True)
        time.sleep(2)
    finally:
        _tmux(session, "kill-server")
    _check_history(tmp_path / "data" / "moeslots" / "chats.sqlite")


def _storm(session: str, rng: random.Random, n: int = 12) -> None:
    """Questions sent and stopped at random moments: Esc before the first token, mid-reply or after it; Enter
    again while stopping (or on the question given back: sent again); a new question typed over a question given
    back. (Text typed while a reply runs stays in the box, refused by Enter: the storm never does that.)"""
    for i in range(n):
        _tmux(session, "send-keys", "-t", session, "-l", f"storm {i} please", check=True)
        _tmux(session, "send-keys", "-t", session, "Enter", check=True)
        time.sleep(rng.choice([0.0, 0.02, 0.1, 0.4]))
        _tmux(session, "send-keys", "-t", session, "Escape", check=True)     # before, during or after the reply
        time.sleep(0.15)          # a key within a few ms of Esc reads as Alt+key (an escape sequence), as in any TUI
        if rng.random() < 0.3:
            _tmux(session, "send-keys", "-t", session, "Enter", check=True)     # Enter while stopping
        _wait_idle(session)       # the prompt box's title: no "answering…"/"stopping…" (typing into a box whose
                                  # Enter was refused would add to the refused question)


def _wait_idle(session: str, timeout: float = 60, quiet: float = 0.6) -> None:
    """Idle for `quiet` seconds on end: a key just sent (an Enter that resends the question given back) may not
    have reached the screen at the first look."""
    t0 = time.monotonic()
    since: float | None = None
    while time.monotonic() - t0 < timeout:
        pane = _pane(session)
        if "answering…" not in pane and "stopping…" not in pane:
            since = since or time.monotonic()
            if time.monotonic() - since >= quiet:
                return
        else:
            since = None
        time.sleep(0.1)
    raise AssertionError(f"the reply never settled; pane:\n{_pane(session)}")


def _check_history(db_path: Path) -> None:
    """The stored chats: user and assistant alternate, every question is one whole typed question (none merged
    with another), in the order typed, and the last question of each chat has its answer."""
    db = sqlite3.connect(db_path)
    try:
        chats = [r[0] for r in db.execute("SELECT DISTINCT chat FROM messages ORDER BY chat")]
        storm: list[int] = []
        for chat in chats:
            rows = db.execute("SELECT role, content FROM messages WHERE chat = ? ORDER BY id", (chat,)).fetchall()
            roles = [r for r, _ in rows]
            assert roles == ["user", "assistant"] * (len(rows) // 2) and len(rows) % 2 == 0, rows
            for role, text in rows:
                if role == "user" and "storm" in text:
                    m = re.fullmatch(r"storm (\d+) please", text)
                    assert m, f"a question merged or cut: {text!r}"
                    storm.append(int(m.group(1)))
        assert storm == sorted(storm), f"a question stored out of order: {storm}"     # resent: next to itself
        assert storm, "no storm question was answered"
    finally:
        db.close()
