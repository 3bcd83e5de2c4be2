"""record -> profile show / merge -> simulate, end to end on a synthetic model, through the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moeslots", *args], capture_output=True, text=True, timeout=300)


def test_record_show_merge_simulate(tiny_qwen: Path, tmp_path: Path) -> None:
    code, chat = tmp_path / "code.txt", tmp_path / "chat.txt"
    code.write_text("def f(x):\n    return [i * i for i in range(x)]\n")
    chat.write_text("Tell me about the weather in a short sentence.")
    a, b, m = tmp_path / "code.csv", tmp_path / "chat.csv", tmp_path / "merged.csv"
    for prompt, out in ((code, a), (chat, b)):
        r = run("record", str(tiny_qwen), "--prompt-file", str(prompt), "-n", "32", "-o", str(out), "--threads", "2")
        assert r.returncode == 0, r.stderr
        assert "32 decode tokens" in r.stdout
    r = run("profile", "merge", str(a), str(b), "-o", str(m), "--slots", "4")
    assert r.returncode == 0, r.stderr
    assert "64 decode tokens" in r.stdout and "top-4 overlap" in r.stdout
    assert m.read_text().count("\n") == a.read_text().count("\n") + b.read_text().count("\n") - 2  # one header
    r = run("profile", "show", str(m), "--slots", "4", "--against", str(a))
    assert r.returncode == 0, r.stderr
    assert "skew" in r.stdout and "coverage at 4 slots" in r.stdout and "L00" in r.stdout
    r = run("simulate", str(b), "--slots", "4", "--train", str(a))
    assert r.returncode == 0, r.stderr
    for pol in ("static-profile", "static-oracle", "lru", "lfu-decay", "reelect-16"):
        assert f"| {pol} |" in r.stdout


def test_bad_trace_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("0,1,2\nnonsense\n")
    r = run("profile", "show", str(p))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("moeslots: error:") and "bad.csv:2" in r.stderr
