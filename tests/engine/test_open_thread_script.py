"""scripts/open_thread_check.py runs end to end on the bundled model: a row per way and process, each with its
replies' tok/s and the process's threads; bad arguments refused in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "open_thread_check.py"


def test_the_script_prints_a_row_for_each_way() -> None:
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "1", "1"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [x.split("|")[1:-1] for x in r.stdout.splitlines() if x.startswith("| c") or x.startswith("| p")]
    assert [w.strip() for w, *_ in rows] == ["caller", "passing", "caller", "passing"], r.stdout
    for _, threads, toks, alive in rows:
        assert threads.strip() == "1" and float(toks) > 0 and int(alive) >= 1


def test_bad_arguments_are_one_line() -> None:
    for args in (["x"], ["0", "1"]):
        r = subprocess.run([sys.executable, "-P", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
