"""The layers of the design card hold (.importlinter, checked with import-linter), and package code imports its own
modules relatively, so an import names the file it reads (`from ..profiles import plan` is profiles/plan.py)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"moeslots": ROOT / "moeslots", "engine": ROOT / "engine", "profiles": ROOT / "profiles",
            "tui": ROOT / "tui"}


def _stage(tmp: Path) -> Path:
    """moeslots/ with engine/, profiles/ and tui/ linked in as the installed package maps them (pyproject
    package-dir): import-linter reads one package tree."""
    pkg = tmp / "moeslots"
    pkg.mkdir()
    for f in (ROOT / "moeslots").iterdir():
        if f.name != "__pycache__":
            (pkg / f.name).symlink_to(f)
    for name in ("engine", "profiles", "tui"):
        (pkg / name).symlink_to(ROOT / name)
    return tmp


def test_import_contracts(tmp_path: Path) -> None:
    stage = _stage(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(stage))
    r = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                        "lint_imports_command()", "--config", str(ROOT / ".importlinter"), "--no-cache"],
                       cwd=stage, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout and "5 kept" in r.stdout, r.stdout


def test_package_code_imports_its_own_modules_relatively() -> None:
    absolute = []
    for pkg, d in PACKAGES.items():
        for f in sorted(d.rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                absolute += [f"{f.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                             if n == "moeslots" or n.startswith("moeslots.")]
    assert not absolute, "\n".join(absolute)


def test_no_module_is_over_about_400_lines() -> None:
    """A module does one job: past ~400 lines it is doing two (the split of engine.py, cli.py, bench.py, build.py,
    simulate.py and app.py by job). Split by job rather than raise this."""
    long = [f"{f.relative_to(ROOT)}: {n}" for d in PACKAGES.values() for f in sorted(d.rglob("*.py"))
            if (n := len(f.read_text(encoding="utf-8").splitlines())) > 420]
    assert not long, long


def test_every_engine_the_app_meets_has_the_whole_protocol() -> None:
    """The app types its engine as engine.api.Engine and calls it without getattr/hasattr: the real Engine, the
    model picker's stand-in and the tests' fakes must each have every member of the protocol."""
    from fakes import FakeEngine, FastEngine  # (tests/ is on sys.path)

    from moeslots.engine import api
    from moeslots.engine.runtime.engine import Engine
    from moeslots.tui.screens.models import Switching

    members = [m for m in vars(api.Engine) if not m.startswith("_")] + list(api.Engine.__annotations__)
    assert {"chat", "snapshot", "set_slots", "profile", "notices", "load_line"} <= set(members)
    for cls in (Engine, Switching):
        assert not [m for m in members if not hasattr(cls, m) and m not in ("notices", "load_line")], cls
    for eng in (FakeEngine(), FastEngine(4), Switching(ROOT / "m.gguf")):
        assert not [m for m in members if not hasattr(eng, m)], type(eng)
