"""In the real app on the bundled model, every decode runs on a thread that has ended once its reply (or slot
change) is done: Textual's thread workers are a pool's threads, kept and reused, and a thread that computed keeps
its CPU thread team parked for as long as it lives (two teams over the CPUs make every wait of both sleep:
engine.runtime.passing_thread). Before, the replies decoded on the pool's threads, which never end."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path

import pytest

from moeslots.engine.machine import bundled
from moeslots.engine.runtime.engine import Engine, EngineConfig
from moeslots.tui import appbench


def test_replies_and_slot_changes_decode_on_threads_that_end(decode_threads: list[threading.Thread]) -> None:
    eng = Engine(EngineConfig(model=bundled.model(), profile=bundled.profile("merged"), slots=bundled.SLOTS,
                              mtp=False, threads=1, pack_host=True, max_tokens=8, n_ctx=512))
    try:
        before = len(decode_threads)
        with tempfile.TemporaryDirectory() as d:
            res = asyncio.run(appbench._run_app_side(eng, "Say hello.", 3, Path(d), timeout=300))
        assert len(res.tok_s) == 3
        replies = list(dict.fromkeys(decode_threads[before:]))     # each thread once, in the order they decoded
        assert replies and all(t.name == "moeslots-reply" for t in replies), [t.name for t in replies]
        assert len(replies) == 3                                    # a thread of its own for each reply ...
        for t in replies:
            t.join(30)
            assert not t.is_alive(), t.name                         # ... that ended with it
    finally:
        eng.close()


def test_a_slot_change_that_calibrates_decodes_on_a_thread_that_ends(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path,
                                                                   decode_threads: list[threading.Thread]) -> None:
    """The app's slot change (the dialog and a recorded profile applied both call EngineActions.set_slots): with
    `auto` and no calibration stored for this shape yet, the new plan calibrates, and those decodes run on a thread
    that has ended when the change returns, none on the caller's."""
    from moeslots.profiles.policy import Policy
    from moeslots.tui.actions import EngineActions

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    eng = Engine(EngineConfig(model=bundled.model(), profile=bundled.profile("merged"), slots=0, mtp=False,
                              threads=1, pack_host=True, policy=Policy("auto"), calibrate="always", n_ctx=512))
    try:
        n = len(decode_threads)                                     # the slot change's decodes alone
        said: list[str] = []
        eng.progress_cb = said.append
        EngineActions(None, lambda: eng).set_slots("16")  # type: ignore[arg-type]
        where = decode_threads[n:]
        assert any(s.startswith("calibrating for --policy auto") for s in said), said
        assert where and threading.current_thread() not in where
        assert {t.name for t in where} == {"moeslots-slots"} and not any(t.is_alive() for t in where)
    finally:
        eng.close()
