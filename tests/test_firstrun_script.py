"""scripts/firstrun.py (the first-run measurement scripts/h200/first-run.sh runs on the H200 box) on the bundled
model with slots in host memory: the second session must start with the profile the first one saved."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from moeslots.engine.machine import bundled

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "firstrun.py"


def test_firstrun_reports_both_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "unused"))
    spec = importlib.util.spec_from_file_location("firstrun", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "firstrun", mod)             # its dataclass looks itself up there
    spec.loader.exec_module(mod)
    model = tmp_path / "m.gguf"
    shutil.copyfile(bundled.model(), model)
    out = tmp_path / "fr.json"
    rc = mod.main([str(model), "-n", "64", "--pack-host", "--threads", "2", "--no-mtp", "--no-reference",
                   "--data-dir", str(tmp_path / "data"), "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "second session started with the saved profile: yes" in text
    r = json.loads(out.read_text())
    assert r["picked_up"] and [s["tokens"] for s in r["sessions"]] == [64, 64]
    assert r["sessions"][0]["profile"] == "" and r["sessions"][1]["profile"] == r["profile"]
    assert all(s["slots"] == 16 and s["tok_s"] > 0 for s in r["sessions"])
    assert mod.main([str(model), "-n", "8", "--pack-host", "--data-dir", str(tmp_path / "data")]) == 2   # not fresh
