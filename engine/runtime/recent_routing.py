"""The inspector's recent routing, kept up to date from the rows written since the last look.

`Engine.snapshot()` runs every UI refresh. It used to copy the whole routing ring (65,536 rows by default, 1.5 MB
on the bundled model) and bincount it each time: 3.6 ms on a full ring, growing with the session. `RecentCounts`
reads only the newest rows (the native read returns the newest `ring_rows` rows with counters of the same instant),
adds them to per (layer, expert) counts and takes away the rows the ring overwrote, which it remembers in a mirror
of the ring's slots. Each update costs the rows written since the last one.

Rows written so far are the picks over k (every row counts k picks). A continuity check backs that up: the row
before the new ones must be the newest row of the last update; any mismatch (a stats reset, a skipped id, more
new rows than the ring holds) rebuilds from the whole ring, as the old snapshot did every time.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ..native.routing_stats import RoutingStats

ReadStats = Callable[[int], RoutingStats]     # ring rows wanted -> counters and the newest rows, oldest first


@dataclasses.dataclass
class RecentCounts:
    n_layer_all: int
    n_expert: int
    k: int
    cap: int                                   # the native ring's rows
    counts: np.ndarray = dataclasses.field(init=False)   # int64 [n_layer_all, n_expert]: decode picks in the ring
    rebuilds: int = 0                          # full reads (the first one, resets, mismatches)
    _keys: np.ndarray = dataclasses.field(init=False, repr=False)   # per ring slot: its decode keys, -1 else
    _seen: int = 0                             # rows written at the last update
    _last: np.ndarray | None = None            # the newest row then
    _ask: int = 256                            # ring rows to read next time

    def __post_init__(self) -> None:
        self.counts = np.zeros((self.n_layer_all, self.n_expert), np.int64)
        self._keys = np.full((max(self.cap, 1), self.k), -1, np.int64)

    def update(self, read: ReadStats) -> RoutingStats:
        """Bring the counts up to date; returns the counters read (their ring: only the rows just read)."""
        if self.cap <= 0:
            return read(0)
        st = read(min(self.cap, self._ask))
        new = self._written(st) - self._seen
        check = self._last is not None                      # the row before the new ones must be the last seen
        if 0 <= new < self.cap and new + check > len(st.ring):
            st = read(min(self.cap, new + check + 64))      # more came than we asked for: once more, enough
            new = self._written(st) - self._seen
        have = len(st.ring)
        if new < 0 or new >= self.cap or new + check > have or \
                (self._last is not None and not np.array_equal(st.ring[have - new - 1], self._last)):
            return self._rebuild(read)
        if new:
            self._add(st.ring[have - new:], self._seen)
            self._last = st.ring[-1].copy()
        self._seen += new
        self._ask = max(256, min(2 * new + 64, 4096))     # a long prompt must not make every later read big
        return st

    def _written(self, st: RoutingStats) -> int:
        return int(st.picks_prompt.sum() + st.picks_decode.sum()) // self.k

    def _rebuild(self, read: ReadStats) -> RoutingStats:
        st = read(self.cap)
        self.rebuilds += 1
        self.counts[:] = 0
        self._keys[:] = -1
        written = self._written(st)
        n = len(st.ring)
        self._add(st.ring, max(written - n, 0))
        self._seen = max(written, n)
        self._last = st.ring[-1].copy() if n else None
        self._ask = 256
        return st

    def _add(self, rows: np.ndarray, first: int) -> None:
        """rows (oldest first) are rows first, first+1, ... of the stream: each takes its ring slot's place."""
        slots = (np.arange(first, first + len(rows)) % self.cap)
        if len(rows) > self.cap:                            # only the last cap of them can be in the ring
            rows, slots = rows[-self.cap:], slots[-self.cap:]
        old = self._keys[slots]
        gone = old[old >= 0]
        flat = self.counts.reshape(-1)
        if gone.size:
            flat -= np.bincount(gone, minlength=flat.size)
        keys = rows[:, 1:2].astype(np.int64) * self.n_expert + rows[:, 2:2 + self.k]
        keys[(rows[:, :1] < 0) | (rows[:, 2:2 + self.k] < 0) | (rows[:, 2:2 + self.k] >= self.n_expert)] = -1
        self._keys[slots] = keys
        live = keys[keys >= 0]
        if live.size:
            flat += np.bincount(live, minlength=flat.size)


LayerView = tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], float, float]


def layer_views(counts: np.ndarray, st: RoutingStats, slots_of: Callable[[int], tuple[int, ...]],
                layers: list[int], window: bool = False) -> list[LayerView]:
    """Per layer: (layer, slot experts, recent picks per slot, decode picks per slot in st, the layer's hit share in
    st, its miss share), as engine.LayerSnapshot takes them. The miss share is the recent ring's, or with `window`
    st's own (1 - the hit share; 0 with no picks): st then holds the counters of the window the inspector's other
    figures count (engine.window_stats), so the heatmap's miss column agrees with the split."""
    out: list[LayerView] = []
    for il in layers:
        slots = slots_of(il)
        idx = np.asarray(slots, np.int64)
        rc = counts[il]
        tot = int(st.hits[il] + st.misses[il])
        rtot = int(rc.sum())
        recent = rc[idx] if idx.size else rc[:0]
        r_hit = int(recent.sum())
        miss = (int(st.misses[il]) / tot if tot else 0.0) if window else (rtot - r_hit) / rtot if rtot else 0.0
        out.append((il, tuple(slots), tuple(recent.tolist()), tuple(int(v) for v in st.picks_decode[il, idx]),
                    int(st.hits[il]) / tot if tot else 0.0, miss))
    return out
