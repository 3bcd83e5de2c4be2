"""The chat history survives the app being killed (SIGKILL) mid-reply: every finished turn is in the database as the
screen showed it, the database is whole, and the reopened app puts the unanswered question back into the prompt
(tests/tui/app_turns.py runs the real app and engine headless in a subprocess)."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.mdtext import as_markdown
from moeslots.tui.store import Store

SCRIPT = Path(__file__).with_name("app_turns.py")


def _run_and_kill(model: Path, db: Path, *, turns: int, stall: int = 0, extra_s: float = 0.0) -> list[dict]:
    """Start the app; wait for `turns` finished turns (with stall: for turn `stall`'s reply to be streaming), then
    extra_s more; SIGKILL it. Returns the finished turns it reported."""
    p = subprocess.Popen([sys.executable, str(SCRIPT), str(model), str(db), "--stall", str(stall)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done: list[dict] = []
    try:
        t0 = time.monotonic()
        assert p.stdout is not None
        while True:
            line = p.stdout.readline()
            assert line, f"the app ended early (exit {p.wait()}): {p.stderr.read()[-2000:] if p.stderr else ''}"
            if line.startswith("{"):
                done.append(json.loads(line))
            if (line.strip() == "STREAMING") if stall else len(done) >= turns:
                break
            assert time.monotonic() - t0 < 120, "the app is too slow"
        time.sleep(extra_s)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        assert p.stdout is not None
        done += [json.loads(ln) for ln in p.stdout.read().splitlines() if ln.startswith("{")]   # printed meanwhile
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == -signal.SIGKILL
    return done


def _check_history(db: Path, done: list[dict]) -> list[tuple[str, str]]:
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    store = Store(db)
    try:
        chat = store.last_chat()
        assert chat is not None
        stored = store.messages(chat)
    finally:
        store.close()
    n = 2 * len(done)
    assert len(stored) >= n, (len(stored), n)
    for i, turn in enumerate(done):                              # every finished turn, as it was shown
        (ru, cu), (ra, ca) = stored[2 * i], stored[2 * i + 1]
        assert (ru, cu) == ("user", turn["user"]) and ra == "assistant" and as_markdown(ca) == turn["shown"]
    rest = stored[n:]                                            # the turn that was cut: its question, maybe its reply
    assert len(rest) <= 2 and all(r == role for (r, _), role in zip(rest, ("user", "assistant")))
    return stored


@pytest.mark.slow
async def test_killed_mid_reply_keeps_every_finished_turn(tmp_path: Path) -> None:
    from moeslots.engine.machine import bundled

    model = bundled.model()
    db = tmp_path / "chats.sqlite"
    done = _run_and_kill(model, db, turns=3, stall=4)
    assert [t["turn"] for t in done] == [1, 2, 3]
    stored = _check_history(db, done)
    assert len(stored) == 7 and stored[-1][0] == "user"          # the 4th question, its reply cut mid-stream

    from fakes import FakeEngine

    app = MoeslotsApp(FakeEngine(), store=Store(db), model_name=model.name)   # reopened on its model: history
                                                                                # back, the question in the prompt
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.2)
        assert app.query_one(Prompt).text == stored[-1][1]
        assert len(list(app.query("ChatMessage"))) == 6
        assert app.store.messages(app.chat_id) == stored[:6]


@pytest.mark.slow
def test_killed_at_a_random_moment_keeps_every_finished_turn(tmp_path: Path) -> None:
    from moeslots.engine.machine import bundled

    rng = random.Random(21)
    for k in range(2):
        db = tmp_path / f"chats{k}.sqlite"
        done = _run_and_kill(bundled.model(), db, turns=2, extra_s=rng.uniform(0.0, 1.5))
        assert len(done) >= 2
        _check_history(db, done)
