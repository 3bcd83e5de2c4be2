"""scripts/h200/share_cpu.cpp (engine v3's CPU side priced before it is built) builds against the engine's ggml and
runs: a tiny shape, one thread, every way it computes a token, each line with a fixed part and a rate."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from test_mmid_op import build_op_test

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200" / "share_cpu.cpp"
LINE = re.compile(r"^ 1 threads, poll +(\d+), (a graph a layer|one graph a token) *: us a layer at 0/1/2/4 CPU "
                  r"experts: ([\d.]+) / ([\d.]+) / ([\d.]+) / ([\d.]+); fixed [\d.]+ us, experts at ([\d.]+) GB/s$",
                  re.M)


def test_share_cpu_builds_and_prices_every_way(tmp_path: Path) -> None:
    exe = build_op_test(tmp_path, SCRIPT, "share_cpu")
    # 12 tokens (10 timed): a median that one preempted token on a busy machine cannot move
    p = subprocess.run([str(exe), "1", "2", "4", "12"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = LINE.findall(p.stdout)
    assert sorted((poll, how) for poll, how, *_ in rows) == [
        ("0", "a graph a layer"), ("0", "one graph a token"), ("100", "a graph a layer"), ("100", "one graph a token")]
    for *_, t0, t1, t2, t4, gbps in rows:
        # four experts cost more than none: the experts were computed (their bytes give a rate)
        assert float(t4) > float(t0) > 0 and float(gbps) > 0, p.stdout
    assert "2 layers x 4 experts, 2.654 MB an expert" in p.stdout
    bad = subprocess.run([str(exe), "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "bad thread count" in bad.stdout
