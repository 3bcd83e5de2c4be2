"""scripts/app_reply_threads.py runs end to end (the real app, headless, on the bundled model): a row per way and
run with each reply's tok/s; bad arguments refused in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "app_reply_threads.py"


def test_the_script_prints_a_row_for_each_way_and_run() -> None:
    r = subprocess.run([sys.executable, "-P", str(SCRIPT), "1", "1", "2"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [x.split("|")[1:-1] for x in r.stdout.splitlines() if x.startswith("| pool") or x.startswith("| own")]
    assert [w.strip() for w, *_ in rows] == ["pool", "own"], r.stdout
    for _, threads, run, toks in rows:
        assert (threads.strip(), run.strip()) == ("1", "1") and len(toks.split()) == 2
        assert all(float(x) > 0 for x in toks.split())


def test_bad_arguments_are_one_line() -> None:
    for args in (["x"], ["2", "0"]):
        r = subprocess.run([sys.executable, "-P", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
