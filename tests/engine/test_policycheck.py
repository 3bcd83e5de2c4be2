"""The policy check (engine.bench.policycheck) on the CPU engine: the twin of the GPU box's run
(scripts/h200/policy-check.sh). Without a GPU stock's two placements are the same computation, so every policy must
give static's logits bit for bit in decode batches of 1 to 8 tokens, and every tier must have moved experts while it
did (else the check would pass trivially)."""

from __future__ import annotations

import numpy as np

from moeslots.engine.bench import policycheck
from moeslots.engine.machine import bundled


def test_every_policy_gives_statics_logits_on_the_cpu() -> None:
    said: list[str] = []
    moved: dict[str, tuple[int, int]] = {}
    out = policycheck.run(bundled.model(), slots=8, threads=2, say=said.append, moved=moved)
    assert {c.policy for c in out} == {"static", "hybrid", "dynamic", "fetch", "fetch-split"}
    assert {c.size for c in out} == set(range(1, 9)) and all(c.ok and c.allowed == 0.0 for c in out), said
    assert said[-1] == f"{len(out)} passed, 0 failed"
    assert set(moved) == {"hybrid", "dynamic", "fetch", "fetch-split"}
    assert all(up > 0 for up, _ in moved.values()), moved                      # every tier moved experts
    assert moved["hybrid"][1] > 0 and moved["fetch-split"][1] > moved["fetch"][1], moved   # the CPU took a share


def test_a_difference_beyond_the_gap_fails() -> None:
    """A row that differs fails its batch size's case (and only it); within the allowed gap it passes."""
    rows = [(s, np.arange(6, dtype=np.float32) + s) for s in (0, 1, 2, 2, 3)]
    off = list(rows)
    off[3] = (2, rows[3][1] + np.float32(0.5))
    diffs = policycheck.by_size(rows, off)
    cases = {c.size: c for c in policycheck.cases("x", diffs, allowed=0.0)}
    assert not cases[2].ok and cases[1].ok and cases[3].ok and cases[2].line().startswith("FAIL x")
    assert all(c.ok for c in policycheck.cases("x", diffs, allowed=0.1))
