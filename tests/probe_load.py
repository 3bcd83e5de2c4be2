"""Run by the tests in a subprocess (an abort inside llama.cpp must not take pytest with it): open MODEL with the
engine as the app does (experts in host memory, MTP when the model has a head, slots in host memory) and decode a
few tokens of a chat; with PROFILE, plan SLOTS slots from it first.

    python tests/probe_load.py MODEL [PROFILE SLOTS]

Prints `ok <notices>` or `error: <the one line the user would see>` and exits 0; anything else (an abort, a
segfault, a hang, an exception that is not an EngineError, an error message of more than one line) is a crash.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run(model: Path, *extra: str, timeout: float = 60) -> str:
    """For the tests: this script on MODEL [PROFILE SLOTS] in a subprocess; its one line. Fails the calling test on
    a crash (a signal, an exception, a hang)."""
    import pytest

    try:
        r = subprocess.run([sys.executable, __file__, str(model), *extra], capture_output=True, text=True,
                           timeout=timeout, env={**os.environ, "GGML_NO_BACKTRACE": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {model.name} hung (> {timeout} s)")
    tail = "\n".join(r.stderr.strip().splitlines()[-6:])          # GGML_ASSERT's line, a Python traceback
    assert r.returncode == 0, f"the engine crashed on {model.name} (exit {r.returncode}):\n{tail}"
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(("ok", "error: ")), r.stdout + tail
    return lines[0]


def main(argv: list[str]) -> int:
    from moeslots.engine.errors import EngineError
    from moeslots.engine.runtime.engine import Done, Engine, EngineConfig, Message

    model = Path(argv[1])
    profile = Path(argv[2]) if len(argv) > 2 else None
    slots = int(argv[3]) if len(argv) > 3 else 0
    try:
        eng = Engine(EngineConfig(model=model, n_ctx=256, threads=1, pack_host=True, mmap=True, max_tokens=3,
                                  profile=profile, slots=slots))
        try:
            done = [ev for ev in eng.chat([Message("user", "hello experts")]) if isinstance(ev, Done)]
            assert len(done) == 1
            eng.snapshot()
            if profile is not None:
                eng.explain_slots()
        finally:
            eng.close()
    except EngineError as e:
        msg = str(e)
        if "\n" in msg.strip():
            print(f"multi-line error: {msg!r}")
            return 3
        print(f"error: {msg}")
        return 0
    print("ok " + " | ".join(eng.notices))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
