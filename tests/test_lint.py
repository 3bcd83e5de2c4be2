"""The code is lint-clean (ruff, `[tool.ruff]` in pyproject.toml) and type-clean (mypy, `[tool.mypy]`) as a whole:
a finding fails the suite, showing what the tool said."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_architecture import _stage  # (tests/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_is_clean() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_clean(tmp_path: Path) -> None:
    """mypy reads the package as it is installed (moeslots.engine is engine/, ...), so it runs on a staged tree."""
    stage = _stage(tmp_path)
    r = subprocess.run([sys.executable, "-m", "mypy", "-p", "moeslots", "--config-file", str(ROOT / "pyproject.toml")],
                       cwd=stage, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
