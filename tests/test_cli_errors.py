"""Every CLI error path is one line on stderr and exit 2: profile show --against a larger profile, a
full disk or a folder as -o, negative --slots; `moeslots record` saves what it recorded on SIGTERM and SIGHUP as on
Ctrl-C."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli import _one_line_error, run

SMALL = "# arch=glm4moe n_layer=4 n_expert=16 k=2\npos,layer,id0,id1\n0,1,1,2\n1,1,2,3\n0,2,4,5\n"
LARGE = "# arch=glm4moe n_layer=8 n_expert=32 k=2\npos,layer,id0,id1\n0,1,1,2\n0,6,30,31\n"


def test_show_against_a_larger_profile_names_both_shapes(tmp_path: Path) -> None:
    """A larger B indexed past A's counts: IndexError, a traceback."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(SMALL)
    b.write_text(LARGE)
    for x, y in ((a, b), (b, a)):
        _one_line_error(run("profile", "show", str(x), "--against", str(y)), "4 layers x 16 experts",
                        "8 layers x 32 experts", "come from different models")


def test_show_against_fork_files_of_different_extent(tmp_path: Path) -> None:
    """Files without `#` facts (the fork's): the larger extent is used, no refusal, no traceback."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("0,1,1,2\n1,1,2,3\n")
    b.write_text("0,1,1,2\n0,5,14,15\n")
    r = run("profile", "show", str(a), "--against", str(b), "--slots", "2")
    assert r.returncode == 0, r.stderr
    assert "top-2 overlap with" in r.stdout


def test_output_that_is_a_folder(tmp_path: Path, tiny_glm: Path) -> None:
    a = tmp_path / "a.csv"
    a.write_text(SMALL)
    _one_line_error(run("profile", "merge", str(a), str(a), "-o", str(tmp_path)), "is a folder")
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    t0 = time.monotonic()
    _one_line_error(run("record", str(tiny_glm), "--prompt-file", str(prompt), "-n", "4", "-o", str(tmp_path)),
                    "is a folder: -o takes the profile's file name")
    assert time.monotonic() - t0 < 30


def _small_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))     # writes past 4 KiB fail (EFBIG): a full disk


def test_a_full_disk_while_saving_keeps_the_old_file(tmp_path: Path) -> None:
    rows = "".join(f"{i},1,{i % 16},{(i + 1) % 16}\n" for i in range(2000))      # ~25 KiB merged
    a, out = tmp_path / "a.csv", tmp_path / "out.csv"
    a.write_text("# arch=glm4moe n_layer=4 n_expert=16 k=2\n" + rows)
    out.write_text("old profile\n")
    r = subprocess.run([sys.executable, "-m", "moeslots", "profile", "merge", str(a), str(a), "-o", str(out)],
                       capture_output=True, text=True, timeout=120, preexec_fn=_small_files)
    _one_line_error(r, f"cannot write {out}", "File too large", "the old file is kept")
    assert out.read_text() == "old profile\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "out.csv"]


@pytest.mark.parametrize("cmd", [
    ["profile", "show", "P", "--slots", "-4"],
    ["simulate", "P", "--slots", "-4"],
    ["profile", "merge", "P", "P", "-o", "OUT", "--slots", "-4"],
    ["bench", "decode", "MODEL", "--slots", "0,-4", "-n", "4"],
    ["bench", "repick", "MODEL", "--every", "0", "--slots", "0,-4"],
])
def test_negative_slots_are_refused(tmp_path: Path, tiny_glm: Path, cmd: list[str]) -> None:
    p = tmp_path / "p.csv"
    p.write_text(SMALL)
    args = [str(p) if x == "P" else str(tiny_glm) if x == "MODEL" else str(tmp_path / "o.csv") if x == "OUT" else x
            for x in cmd]
    _one_line_error(run(*args), "--slots takes", ">= 0")
    assert not (tmp_path / "o.csv").exists()


def test_slots_beyond_the_experts_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "p.csv"
    p.write_text(SMALL)
    _one_line_error(run("profile", "show", str(p), "--slots", "17"), "--slots 17", "16 experts per layer")


def _sigint_delivered() -> None:
    """In the child before exec: SIGINT as a terminal delivers it. A suite started in the background by a shell
    (`make test &`) inherits SIGINT ignored, as POSIX has background jobs do, and Python then leaves it ignored: the
    recording would never see the signal this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_record_saves_on_sigterm_and_sighup(tiny_glm: Path, tmp_path: Path) -> None:
    """SIGTERM (and SIGHUP: a closed terminal) killed `moeslots record` and lost the recording; now handled like
    Ctrl-C: what was recorded is saved, exit 128 + the signal."""
    prompts = []
    for i in range(40):                                        # far more work than the few seconds we wait
        prompts += ["--prompt-file", str(tmp_path / f"p{i}.txt")]
        (tmp_path / f"p{i}.txt").write_text(f"Question {i}: what does this function do?")
    procs = {}
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        out = tmp_path / f"{sig.name}.csv"
        procs[sig] = (out, subprocess.Popen([sys.executable, "-m", "moeslots", "record", str(tiny_glm), *prompts,
                                             "-n", "2000", "--threads", "1", "--temperature", "1", "-o", str(out)],
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            preexec_fn=_sigint_delivered))
    time.sleep(4.0)                                            # loaded and decoding (tiny model: ~0.2 s to load)
    for sig, (_, p) in procs.items():
        p.send_signal(sig)
    for sig, (out, p) in procs.items():
        _, err = p.communicate(timeout=60)
        assert p.returncode == 128 + sig, (sig.name, p.returncode, err[-600:])
        assert f"interrupted ({sig.name}): what was recorded" in err and f"is saved in {out}" in err, err
        from moeslots.profiles.trace import read_csv

        assert read_csv(out).decode_tokens > 0
    assert os.listdir(tmp_path).count("SIGTERM.csv") == 1


def _catches(pid: int, sig: int) -> bool:
    """Whether process pid has a handler for sig (its SigCgt mask in /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


def test_record_says_so_when_signalled_before_it_records(tiny_glm: Path, tmp_path: Path) -> None:
    """SIGTERM as soon as `moeslots record` handles it (while the model loads, before any token): one line saying
    nothing was recorded and the file untouched, exit 128 + 15 (it was a bare "interrupted", exit 130)."""
    (tmp_path / "p.txt").write_text("Question: what does this function do?")
    out = tmp_path / "early.csv"
    p = subprocess.Popen([sys.executable, "-m", "moeslots", "record", str(tiny_glm), "--prompt-file",
                          str(tmp_path / "p.txt"), "-n", "2000", "--threads", "1", "-o", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not _catches(p.pid, signal.SIGTERM) and p.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.002)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, (p.returncode, err[-600:])
    assert "interrupted (SIGTERM): " in err and ("before recording began" in err or "no decode token" in err), err
    assert not out.exists()


def test_a_model_the_engine_refuses_is_one_line_of_ours(tiny_glm: Path, tmp_path: Path) -> None:
    """A GGUF whose header reads but whose data llama.cpp refuses (cut short): our one line, exit 2, and none of
    llama.cpp's own log lines before it."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_glm.read_bytes()[: tiny_glm.stat().st_size // 2])
    r = run("chat", str(cut))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("moeslots: ") and "could not load" in r.stderr, r.stderr
