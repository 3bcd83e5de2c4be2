"""The package's build configuration gives no setuptools warning on install (`make run` shows none): the licence as
an SPDX string (a table is deprecated from setuptools 77 on), and every folder that holds shipped data files listed
as a package (setuptools otherwise warns that it "would be ignored")."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_has_nothing_setuptools_warns_about() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(cfg["project"]["license"], str)
    assert any(r.startswith("setuptools>=77") for r in cfg["build-system"]["requires"])
    st = cfg["tool"]["setuptools"]
    for pkg, files in st["package-data"].items():
        folder = ROOT / st["package-dir"][pkg]
        assert pkg in st["packages"] and all(list(folder.glob(f)) for f in files), (pkg, files)
    shipped = {ROOT / st["package-dir"][p] for p in st["package-data"]}
    data = {p.parent for pat in ("engine/**/*.gguf", "engine/**/*.patch", "profiles/**/*.csv") for p in ROOT.glob(pat)}
    assert data <= shipped, data - shipped
