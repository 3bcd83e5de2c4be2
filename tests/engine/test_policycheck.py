"""The policy check (engine.bench.policycheck) on the CPU engine: the twin of the GPU box's run
(scripts/h200/policy-check.sh). Without a GPU stock's two placements are the same computation, so every policy must
give static's logits bit for bit in decode batches of 1 to 8 tokens and static's tokens in MTP greedy decoding, and
every tier must have moved experts while it did (else the check would pass trivially)."""

from __future__ import annotations

import numpy as np

from moeslots.engine.bench import policycheck
from moeslots.engine.machine import bundled


def test_every_policy_gives_statics_logits_on_the_cpu() -> None:
    said: list[str] = []
    moved: dict[str, tuple[int, int]] = {}
    out = policycheck.run(bundled.model(), slots=8, threads=2, say=said.append, moved=moved)
    batches = [c for c in out if isinstance(c, policycheck.Case)]
    mtp = [c for c in out if isinstance(c, policycheck.MtpCase)]
    assert {c.policy for c in batches} == {"static", "hybrid", "dynamic", "fetch", "fetch-split"}
    assert {c.size for c in batches} == set(range(1, 9)) and all(c.ok and c.allowed == 0.0 for c in batches), said
    # MTP greedy decoding (the bundled model has a NextN block): every policy gives static's tokens, all of them
    assert [c.policy for c in mtp] == ["static", "hybrid", "dynamic", "fetch", "fetch-split"], said
    assert all(c.ok and c.agree == c.need == policycheck.MTP_TOKENS and c.acceptance > 0 for c in mtp), said
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
    assert policycheck._agree([1, 2, 3, 4], [1, 2, 9, 4]) == 2 and policycheck._agree([1, 2], [1, 2, 3]) == 2
    assert not policycheck.MtpCase("x", 2, 48, 0.5).ok and policycheck.MtpCase("x", 48, 48, 0.5).ok
