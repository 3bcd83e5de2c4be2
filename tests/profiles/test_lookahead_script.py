"""scripts/lookahead.py (docs/lab/2026-12-07-lookahead.md): its guess of the next layer's misses from this layer's
picks, on routing where the next layer follows this one exactly and on routing where it does not."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "lookahead.py"


@pytest.fixture(scope="module")
def la() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lookahead", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["lookahead"] = mod
    spec.loader.exec_module(mod)
    return mod


def _routing(T: int, L: int, follow: bool, seed: int) -> np.ndarray:
    """(T, L, K) picks: layer 0 random; each next layer a fixed shift of the one before (follow) or random."""
    rng = np.random.default_rng(seed)
    P = np.zeros((T, L, 8), np.int64)
    for t in range(T):
        P[t, 0] = rng.choice(128, 8, replace=False)
        for il in range(1, L):
            P[t, il] = (P[t, il - 1] + 37) % 128 if follow else rng.choice(128, 8, replace=False)
    return P


def test_the_guess_catches_a_layer_that_follows_the_one_before(la: ModuleType) -> None:
    prof, test = _routing(600, 4, True, 1), _routing(300, 4, True, 2)
    C = la.cooccurrence(prof)
    assert C.shape == (3, 128, 128) and C.sum() == 600 * 3 * 64       # every pair of picks, counted once
    resident = np.zeros((4, 128), bool)
    resident[:, :64] = True
    per, recall, precision = la.guess(test, C, resident, 8)
    assert per == pytest.approx(4.0, abs=0.5)                        # half the picks miss 64 of 128 slots
    assert recall == 1.0 and precision > 0.4       # every miss among the 8 best guesses, about half of them misses
    _, r0, p0 = la.guess(test, C, resident, 8, fixed=True)
    assert r0 < 0.3 and p0 < 0.3                                     # counts alone know nothing of this token


def test_the_guess_knows_nothing_of_independent_layers(la: ModuleType) -> None:
    prof, test = _routing(600, 4, False, 3), _routing(300, 4, False, 4)
    resident = np.zeros((4, 128), bool)
    resident[:, :64] = True
    _, recall, precision = la.guess(test, la.cooccurrence(prof), resident, 8)
    assert recall < 0.3 and precision < 0.3                          # about 8 of 64 non-resident experts: 1/8
