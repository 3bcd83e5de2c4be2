"""RecentCounts (the snapshot's recent picks) equals a full recount of the ring after every update: small and big
steps, wrap-around, a stats reset, and on the real engine across replies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moeslots.engine.native.routing_stats import RoutingStats
from moeslots.engine.runtime.recent_routing import RecentCounts, layer_views

L, E, K = 5, 16, 3


class FakeRing:
    """The native stats' semantics: counters, and the newest `ring_rows` rows of a ring of `cap` rows."""

    def __init__(self, cap: int, seed: int = 0):
        self.cap, self.rows, self.rng = cap, [], np.random.default_rng(seed)
        self.pp = np.zeros((L, E), np.uint64)
        self.pd = np.zeros((L, E), np.uint64)
        self.reads = 0
        self.rows_read = 0

    def write(self, n: int, prompt: bool = False) -> None:
        for _ in range(n):
            il = int(self.rng.integers(L))
            ids = self.rng.choice(E, K, replace=False)
            pos = len(self.rows)
            self.rows.append(np.r_[-pos - 1 if prompt else pos, il, ids].astype(np.int32))
            (self.pp if prompt else self.pd)[il, ids] += 1

    def reset(self) -> None:
        self.rows, self.pp[:], self.pd[:] = [], 0, 0

    def read(self, ring_rows: int) -> RoutingStats:
        self.reads += 1
        n = min(len(self.rows), self.cap, ring_rows)
        self.rows_read += n
        ring = np.array(self.rows[len(self.rows) - n:], np.int32).reshape(n, 2 + K)
        z = np.zeros(L, np.uint64)
        return RoutingStats(self.pp.copy(), self.pd.copy(), z, z, ring)

    def full_counts(self) -> np.ndarray:
        ring = np.array(self.rows[-self.cap:], np.int32).reshape(-1, 2 + K)
        dec = ring[ring[:, 0] >= 0]
        keys = (dec[:, 1:2].astype(np.int64) * E + dec[:, 2:]).ravel()
        return np.bincount(keys, minlength=L * E).reshape(L, E)


def test_incremental_counts_equal_a_full_recount() -> None:
    ring = FakeRing(cap=300)
    rc = RecentCounts(L, E, K, ring.cap)
    steps = [5, 0, 1, 40, 299, 1, 7, 120, 301, 3, 1000, 2, 64]
    for i, n in enumerate(steps):
        ring.write(n, prompt=i % 4 == 1)
        rc.update(ring.read)
        assert np.array_equal(rc.counts, ring.full_counts()), (i, n)
    assert rc.rebuilds == 2                   # the two steps that overwrote the whole ring
    ring.reset()
    ring.write(10)
    rc.update(ring.read)
    assert np.array_equal(rc.counts, ring.full_counts()) and rc.rebuilds == 3


def test_updates_read_only_the_new_rows() -> None:
    ring = FakeRing(cap=65536)
    ring.write(60000)
    rc = RecentCounts(L, E, K, ring.cap)
    rc.update(ring.read)                      # the first look reads every row written
    ring.write(12)
    rc.update(ring.read)                      # the next one at most 4096 (a long prompt may have come)
    before = ring.rows_read
    for _ in range(48):
        ring.write(12)
        rc.update(ring.read)
    assert ring.rows_read - before <= 48 * 256 and np.array_equal(rc.counts, ring.full_counts())


def test_a_rewritten_ring_with_the_same_row_count_is_noticed() -> None:
    """A reset followed by as many rows as before: the counters alone cannot tell, the continuity row can."""
    ring = FakeRing(cap=100, seed=1)
    rc = RecentCounts(L, E, K, ring.cap)
    ring.write(30)
    rc.update(ring.read)
    ring.reset()
    ring.rng = np.random.default_rng(7)
    ring.write(30)
    rc.update(ring.read)
    assert np.array_equal(rc.counts, ring.full_counts())


def test_layer_views() -> None:
    counts = np.arange(L * E, dtype=np.int64).reshape(L, E)
    z = np.zeros(L, np.uint64)
    hits = np.array([0, 3, 0, 0, 0], np.uint64)
    misses = np.array([0, 1, 0, 0, 0], np.uint64)
    st = RoutingStats(np.zeros((L, E), np.uint64), np.ones((L, E), np.uint64) * 2, hits, misses,
                      np.zeros((0, 2 + K), np.int32))
    (v,) = layer_views(counts, st, lambda il: (0, 2), [1])
    assert v[:4] == (1, (0, 2), (16, 18), (2, 2)) and v[4] == 0.75
    assert v[5] == (counts[1].sum() - 34) / counts[1].sum()
    (w,) = layer_views(counts, RoutingStats(st.picks_prompt, st.picks_decode, z, z, st.ring), lambda il: (), [2])
    assert w[1:4] == ((), (), ()) and w[4] == 0.0 and w[5] == 1.0


@pytest.mark.parametrize("ring_rows", [150, 4096])
def test_engine_snapshot_counts_match_the_ring(tiny_glm: Path, ring_rows: int) -> None:
    from moeslots.engine.native.expert_cache import SlotPlan
    from moeslots.engine.runtime.engine import Engine, EngineConfig, Message

    eng = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, max_tokens=24, mtp=True,
                              stats_ring=ring_rows))
    try:
        f = eng.model.facts
        eng.set_slots(SlotPlan.uniform([il for il in f.moe_layers if il < f.n_layer], 4, f.n_expert))
        for i, q in enumerate(["hello", "tell me more", "and again", "a new topic entirely"]):
            if i == 3:
                eng.new_chat()
            for _ in eng.chat([Message("user", q)]):
                pass
            snap = eng.snapshot()
            ring = eng.ctx.read_stats().ring
            dec = ring[ring[:, 0] >= 0]
            for ls in snap.layers:
                rows = dec[dec[:, 1] == ls.layer][:, 2:]
                assert ls.slot_hits_recent == tuple(int((rows == e).sum()) for e in ls.slot_experts)
        if ring_rows > 1000:
            assert eng._recent.rebuilds == 0   # the ring never overflowed between looks: new rows only
    finally:
        eng.close()
