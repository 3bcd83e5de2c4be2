"""`moeslots bench app` on the bundled model: the app decodes at least FLOOR of the engine alone's speed, with the
same text. Before the streaming rework the app ran the bundled model at 37 % (MTP off) and 49 % (MTP on) of the
engine on a 2-core box, 66-70 % even with a core left to it; now 91-103 % (docs/measurements.md). The floor is far below
today's figures so a loaded CI runner does not flake it, and above anything the old app reached."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from moeslots.engine.machine import bundled

FLOOR = 0.75
ATTEMPTS = 3          # a timing test on a shared runner: the best of three must clear the floor
QUIET = 0.5           # other processes' cores (as the bench reads them) under which a run speaks for the app: with
                      # a second test suite beside it (1.0-1.5 cores) the app, two busy threads against the engine's
                      # one, fell to 31-72 % while the same commit alone read 91-103 %


def _bench(tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "moeslots", "bench", "app", str(bundled.model()), "--slots", "16",
                        "-n", "128", "--replies", "5", "--json", str(out), *flags],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "app / engine:" in r.stdout
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("flags", [("--no-mtp",), ()], ids=["mtp-off", "mtp-auto"])
def test_the_app_decodes_near_the_engine_speed(tmp_path: Path, flags: tuple[str, ...]) -> None:
    """The best of ATTEMPTS runs clears FLOOR; a run with other processes above QUIET cores says nothing about the
    app (it is starved, not slow): if every run was busy, the speed is not judged (the text still is)."""
    seen, quiet = [], 0
    for _ in range(ATTEMPTS):
        res = _bench(tmp_path, *flags)
        assert res["same_text"], "the app's reply differs from the engine alone's"
        assert res["engine"]["tokens"] == res["app"]["tokens"]
        others = max(res["engine"]["others"], res["app"]["others"])
        quiet += others <= QUIET
        seen.append(f"{100 * res['ratio']:.0f} % (engine {res['engine_median']:.0f}, app {res['app_median']:.0f} "
                    f"tok/s, other processes {res['engine']['others']:.1f}/{res['app']['others']:.1f} cores)")
        if res["ratio"] >= FLOOR:
            return
    if not quiet:
        pytest.skip(f"other processes took over {QUIET} cores in every run: " + "; ".join(seen))
    pytest.fail(f"app / engine below {100 * FLOOR:.0f} % in {ATTEMPTS} runs: " + "; ".join(seen))


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args in (["bench", "app", str(tmp_path / "nope.gguf")],
                 ["bench", "app", str(bundled.model()), "-n", "0"],
                 ["bench", "app", str(bundled.model()), "--no-mtp", "--mtp-always"],
                 ["bench", "app", str(bundled.model()), "--profile", str(tmp_path / "none.csv")]):
        r = subprocess.run([sys.executable, "-m", "moeslots", *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("moeslots: error:"), \
            (args, r.stderr)
