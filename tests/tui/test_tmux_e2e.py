"""End to end: the real app (`moeslots`, the bundled model) in tmux: a reply appears, the load line and the
heatmap rows appear, and changing the slots works."""

from __future__ import annotations

import os
import shlex
import shutil
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
        _tmux(session, "send-keys", "-t", session, "C-q", check=True)
    finally:
        _tmux(session, "kill-server")
