"""profiles.locality: reuse distance, overlap over W tokens, working set and per-layer skew, on routings with known
answers (each test fails on an off-by-one in the window or on a wrong baseline)."""

from __future__ import annotations

import numpy as np
import pytest

from moeslots.profiles.locality import (
    layer_skew,
    locality,
    reuse_distances,
    uniform_overlap,
    window_overlap,
    working_set,
)


def test_reuse_distances_by_hand() -> None:
    P = np.array([[[0, 1]], [[1, 2]], [[3, 4]], [[0, 2]]])        # T=4, one layer, k=2
    d = reuse_distances(P, 5)
    assert d[:, 0].tolist() == [[-1, -1], [1, -1], [-1, -1], [3, 2]]
    ov = window_overlap(d, [1, 2, 3], start=1)                   # tokens 1..3: 6 picks
    assert ov == {1: pytest.approx(1 / 6), 2: pytest.approx(2 / 6), 3: pytest.approx(3 / 6)}


def test_layers_are_separate() -> None:
    P = np.array([[[0], [1]], [[1], [0]]])                       # the same ids, swapped between layers
    assert (reuse_distances(P, 2)[1] == -1).all()


def test_uniform_routing_matches_the_formula() -> None:
    rng = np.random.default_rng(0)
    T, L, k, n = 3000, 4, 8, 128
    P = np.argsort(rng.random((T, L, n)), axis=2)[:, :, :k]
    loc = locality(P, n, (1, 8, 64))
    for w in (1, 8, 64):
        assert loc.overlap[w] == pytest.approx(uniform_overlap(k, n, w), abs=0.01)
    assert uniform_overlap(8, 128, 1) == pytest.approx(1 / 16)
    assert loc.working_set[1] == 8 and loc.working_set[8] == pytest.approx(128 * (1 - (1 - 1 / 16) ** 8), rel=0.02)


def test_a_repeating_routing_is_fully_local() -> None:
    P = np.tile(np.array([[[5, 6, 7]]]), (100, 2, 1))
    loc = locality(P, 16, (1, 8))
    assert loc.overlap == {1: 1.0, 8: 1.0} and loc.median_reuse == 1.0 and loc.working_set[8] == 3
    assert loc.never_reused == pytest.approx(6 / 600)
    assert working_set(P[:5], 8, 16) != working_set(P[:5], 8, 16)       # fewer tokens than one window: nan


def test_layer_skew() -> None:
    counts = np.zeros((3, 100))
    counts[0, 7] = 50                                            # one expert takes all
    counts[1] = 1                                                # flat
    s = layer_skew(counts)                                       # layer 2 never routed: left out
    assert s["top10"].tolist() == pytest.approx([1.0, 0.1]) and s["top25"][1] == pytest.approx(0.25)
    assert s["effective"].tolist() == pytest.approx([1.0, 100.0])
