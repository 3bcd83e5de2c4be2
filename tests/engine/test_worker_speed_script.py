"""scripts/h200/worker_speed.py (patch 0010's worker against fetch and the split graph) runs on the CPU engine with the
bundled model: every way is a row, the worker leaves the split as the graph made it (the same CPU picks and uploads a
token: the same rule at the same costs) and computes one share a layer a token, fetch leaves the CPU nothing; bad
arguments are refused in one line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from moeslots.engine.machine import bundled

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200" / "worker_speed.py"
ROW = re.compile(r"^\| 2 \| 8 \| ([a-z -]+?(?:, [a-z]+(?: \d)?)?) \| ([\d.]+) \| [\d., ]+ \| ([\d.]+) \| ([\d.]+) \| "
                 r"([\d.]+) \| [\d.]+ \| [\d.]+ \|$", re.M)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_worker_speed_measures_every_way_with_the_same_split() -> None:
    p = _run(str(bundled.model()), "2", "8", "1", "8", "--cpu-gbps=100")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = {way: (float(cpu), float(up), float(shares)) for way, _, cpu, up, shares in ROW.findall(p.stdout)}
    assert set(rows) == {"fetch", "fetch-split, graph", "fetch-split, worker 2", "fetch-split, worker 1"}, p.stdout
    assert rows["fetch"][0] == 0 and rows["fetch"][2] == 0
    split = rows["fetch-split, graph"]
    assert split[0] > 0 and split[2] == 0
    layers = int(re.search(r"(\d+) MoE layers", p.stdout).group(1))     # type: ignore[union-attr]
    for w in ("fetch-split, worker 2", "fetch-split, worker 1"):
        assert rows[w][:2] == split[:2] and rows[w][2] == layers, (w, p.stdout)


def test_worker_speed_refuses_bad_arguments() -> None:
    p = _run(str(bundled.model()), "0")
    assert p.returncode != 0 and "must be positive" in p.stderr
    p = _run(str(bundled.model()), "x")
    assert p.returncode != 0 and "worker_speed.py:" in p.stderr
