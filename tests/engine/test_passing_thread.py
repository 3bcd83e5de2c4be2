"""Opening a model computes nothing on the calling thread (engine.runtime.passing_thread): the first-run calibration's
decodes run in a thread that ends with the load, so no OpenMP team of the engine's CPU backend outlives them beside
the team of each reply's thread (two teams over the CPUs make every wait of both sleep)."""

from __future__ import annotations

import _thread
import functools
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from moeslots.engine.runtime import passing_thread
from moeslots.profiles.policy import Policy
from moeslots.profiles.trace import from_rows, write_csv


def test_run_returns_the_value_and_raises_the_error_on_the_calling_thread() -> None:
    caller = threading.get_ident()
    assert passing_thread.run(lambda: threading.get_ident()) != caller
    with pytest.raises(KeyError, match="gone"):
        passing_thread.run(lambda: {}["gone"])
    assert not [t for t in threading.enumerate() if t.name == "moeslots-open"]      # each ended with its work


def test_opening_a_model_decodes_off_the_calling_thread(tiny_glm: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        decode_threads: list[threading.Thread]) -> None:
    """`chat MODEL` with auto and a first-run calibration to make (asked for without a GPU here, as a GPU machine's
    first session does by itself): every decode of the load runs on a thread that has ended when the engine is
    returned, none on the caller's; the reply's decodes run where the reply is consumed."""
    from moeslots.cli.chat import open_engine
    from moeslots.cli.launch import ChatSettings
    from moeslots.engine.runtime import engine as engine_mod

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setattr(engine_mod, "EngineConfig", functools.partial(engine_mod.EngineConfig, calibrate="always"))
    rng = np.random.default_rng(5)
    rows = [(t, il, rng.choice(16, 4, replace=False).tolist()) for t in range(400) for il in (1, 2)]
    prof = tmp_path / "p.csv"
    write_csv(from_rows(rows, {"n_expert": "16"}, k=4), prof)
    where = decode_threads
    said: list[str] = []
    eng = open_engine(tiny_glm, ChatSettings(profile=prof, slots="6", mtp=False, threads=2, ctx=256,
                                             policy=Policy("auto")), progress=said.append)
    try:
        assert any(s.startswith("calibrating for --policy auto") for s in said), said      # the load decoded
        assert where and threading.current_thread() not in where, len(where)
        assert not any(t.is_alive() for t in where)                                     # and that thread is gone
        n = len(where)
        reply = list(eng.chat([engine_mod.Message("user", "hello")], max_tokens=4))
        assert reply and where[n:] and set(where[n:]) == {threading.current_thread()}
    finally:
        eng.close()


def test_ctrl_c_while_it_runs_stops_the_work_too_and_is_raised_once_it_has_ended() -> None:
    """Ctrl-C reaches the waiting caller; the work gets it where it is (as it would on the caller's thread), cleans
    up, and only then does the caller raise: nothing keeps loading while the process exits."""
    seen: list[str] = []

    def work() -> None:
        threading.Timer(0.3, _thread.interrupt_main).start()         # once the work runs, as a user's Ctrl-C
        try:
            for _ in range(3000):                              # 30 s: far past the interrupt
                time.sleep(0.01)
            seen.append("finished")
        except KeyboardInterrupt:
            seen.append("interrupted")
            raise
        finally:
            seen.append("cleaned up")

    with pytest.raises(KeyboardInterrupt):
        passing_thread.run(work, name="test-interrupted")
    assert seen == ["interrupted", "cleaned up"]
    assert not [t for t in threading.enumerate() if t.name == "test-interrupted"]
