"""CLI behaviour: doctor says patched; bad input is one line on stderr (no traceback); generate streams text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "moeslots", *args], capture_output=True, text=True, timeout=timeout)


def test_doctor_reports_patched() -> None:
    """`moeslots doctor`: one `key  value` row per fact (the key in 16 columns): the engine, patched with this
    checkout's series, the CPU threads this process may use, and no calibration (the tests' config is empty)."""
    import os

    from moeslots.engine.build import patchset

    r = run("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = dict((line[:16].strip(), line[17:]) for line in r.stdout.splitlines() if line.strip())
    assert list(rows)[0] == "engine" and rows["engine"].startswith("llama-cpp-python 0.3.36 at ")
    assert rows["patched"] == f"yes (moeslots 2 (patches {patchset.patches_hash(patchset.patch_files())}))"
    assert rows["cpu threads"] == str(len(os.sched_getaffinity(0)))
    assert rows["gpu"].startswith("none") and "CPU" in rows["backends"]
    assert rows["calibration"].startswith("none for this machine (--policy auto measures its own the first time")


def test_native_struct_matches_ggml() -> None:
    import ctypes

    from moeslots.engine.native import lib as native

    L = native.lib()
    L.ggml_tensor_overhead.restype = ctypes.c_size_t
    assert ctypes.sizeof(native.ggml_tensor) == 336
    assert L.ggml_tensor_overhead() == ctypes.sizeof(native.ggml_tensor) + 32


def _one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(err) == 1, r.stderr
    assert err[0].startswith("moeslots: error: ")
    for n in needles:
        assert n in err[0], err[0]


def test_missing_model(tmp_path: Path) -> None:
    _one_line_error(run("generate", str(tmp_path / "nope.gguf")), "not found", "nope.gguf")


def test_not_a_gguf(tmp_path: Path) -> None:
    p = tmp_path / "notes.txt"
    p.write_text("hello, I am not a model\n")
    _one_line_error(run("generate", str(p)), "not a GGUF")


def test_truncated_gguf(tmp_path: Path, tiny_glm: Path) -> None:
    p = tmp_path / "cut.gguf"
    p.write_bytes(tiny_glm.read_bytes()[:3000])
    _one_line_error(run("generate", str(p)), "cut.gguf")


def test_dense_model_is_refused(dense_gguf: Path) -> None:
    _one_line_error(run("generate", str(dense_gguf)), "dense model", "Mixture-of-Experts")


def test_directory_is_refused(tmp_path: Path) -> None:
    _one_line_error(run("generate", str(tmp_path)), "not a file")


def test_generate_streams_greedy_text(tiny_qwen: Path) -> None:
    a = run("generate", str(tiny_qwen), "-p", "hello", "-n", "16", "--threads", "2")
    b = run("generate", str(tiny_qwen), "-p", "hello", "-n", "16", "--threads", "2")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout and a.stdout.strip()
    assert "tok/s" in a.stderr


@pytest.mark.slow
def test_synth_cli_prints_routing_check(tmp_path: Path) -> None:
    out = tmp_path / "s.gguf"
    r = run("synth", "-o", str(out), "--arch", "qwen3moe", "--layers", "2", "--n-embd", "128", "--experts", "32",
            "--expert-ff", "64", "--vocab", "300", "--check-tokens", "128", "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert "routing check over 128 random tokens" in r.stdout and "non-degenerate" in r.stdout
    assert out.exists()


def test_stock_or_stale_engine_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from moeslots.engine.errors import NotPatchedError
    from moeslots.engine.native import lib as native

    assert native.require_patched().startswith("moeslots ")
    monkeypatch.setattr(native, "patch_version", lambda: None)
    with pytest.raises(NotPatchedError, match="not the moeslots-patched engine"):
        native.require_patched()
    monkeypatch.undo()
    monkeypatch.setattr(native, "expected_patch_id", lambda: "0123456789abcdef")
    with pytest.raises(NotPatchedError, match="rebuild with `moeslots engine build`"):
        native.require_patched()


def test_bad_config_is_one_line(tmp_path: Path, tiny_qwen: Path) -> None:
    import os

    cfg = tmp_path / "cfg" / "moeslots"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text("[app]\nslots = [1, 2]\n")
    r = subprocess.run([sys.executable, "-m", "moeslots", "chat", str(tiny_qwen)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    _one_line_error(r, "config.toml", "app.slots has the wrong type")


def test_a_missing_bundled_model_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from moeslots import cli
    from moeslots.engine.machine import bundled

    monkeypatch.setattr(bundled, "_ASSETS", tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))        # no [app] model of the developer's
    for cmd in (["demo"], []):                                   # `moeslots demo`, `moeslots` (the app)
        assert cli.main(cmd) == 2
        err = capsys.readouterr().err
        assert "the bundled model is missing" in err and "Traceback" not in err


def test_bench_repick_intervals_are_checked(tiny_glm: Path) -> None:
    """`bench repick --every` takes intervals >= 0 or auto: -1 (the bench's internal code for auto) is refused too."""
    for bad in ("0,-1", "0,x", "16,-5"):
        _one_line_error(run("bench", "repick", str(tiny_glm), "--every", bad, "--slots", "4"), "--every takes", bad)


def test_each_bench_takes_only_its_own_flags(tiny_glm: Path) -> None:
    """`bench` picked its mode by which flags were present (--mtp silently won over --repick): each benchmark is a
    subcommand now, and another's flag is refused."""
    for cmd in (["decode", "--every", "16"], ["mtp", "--every", "16"], ["repick", "--every", "16", "--drafts", "1"],
                ["compare", "--no-stats"], ["decode", "--prompts", "2"]):
        r = run("bench", cmd[0], str(tiny_glm), *cmd[1:])
        assert r.returncode == 2 and "unrecognized arguments" in r.stderr, (cmd, r.stderr)
    r = run("bench", str(tiny_glm), "--slots", "4")
    assert r.returncode == 2 and "invalid choice" in r.stderr and "decode" in r.stderr
