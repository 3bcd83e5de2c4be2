"""The dynamic tier in the engine (`--policy hybrid|dynamic`): per layer the plan's first S - D slots are a static
core, its last D slots a tier whose residents follow the routing by profiles.hybrid's rule (the simulator's, so
`moeslots simulate --policy hybrid` predicts it).

After each decode step the new routing rows are read from the native ring (only the newest rows), each decoded
token is run through the rule (profiles.hybrid.Tier with the ENGINE mechanism): every miss was computed on the CPU
in that token; a miss the costs say to keep is staged into the layer's spare pack entry on a worker thread while the
next token decodes (engine.cache.stage) and committed in place of the tier's weakest entry between tokens
(engine.cache.commit) — exact, since placement is not math. One copy per layer in flight.

Not yet: "upload now and compute on the GPU in the same token". The rule already decides it (Step.uploads_now,
with Mechanism.upload_now); the engine turns it off because the cache cannot compute a just-uploaded expert in the
token that needed it until the cache rewrite of issue 18. When it can, `_execute` gets a second path for
uploads_now (a synchronous copy before the layer runs) and TierRunner passes a Mechanism with upload_now=True.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Callable

import numpy as np

from ..profiles.costs import CostModel
from ..profiles.hybrid import ENGINE, Mechanism, Tier
from . import cache as cache_mod
from .cache import SlotPlan
from .stats import RoutingStats

ReadStats = Callable[[int], RoutingStats]     # ring rows wanted -> counters and the newest rows, oldest first


@dataclasses.dataclass
class TierCounts:
    tokens: int = 0              # decode tokens run through the rule
    core_hits: int = 0           # picks served by the static core
    tier_hits: int = 0           # picks served by the tier
    cpu: int = 0                 # picks computed on the CPU
    decided: int = 0             # prefetches decided
    landed: int = 0              # prefetches committed (resident)
    bytes: int = 0               # bytes copied for them
    failed: int = 0              # copies refused by the cache (the tier stayed as it was)


class TierRunner:
    """The tier of one model's cache over a plan of S slots per layer (all layers the same S; D <= S)."""

    def __init__(self, model_ptr: int, plan: SlotPlan, tier: int, cost: CostModel, read: ReadStats, *,
                 n_expert: int, k: int, wait: bool = False, mech: Mechanism = ENGINE) -> None:
        self.model_ptr, self.read, self.n_expert, self.k, self.wait = model_ptr, read, n_expert, k, wait
        self.plan = plan
        self.layers = sorted(plan.layers)
        self.col = {il: j for j, il in enumerate(self.layers)}
        self._colmap = np.full(max(self.layers, default=0) + 1, -1, np.int64)     # model layer -> column
        self._colmap[self.layers] = np.arange(len(self.layers))
        core, first = masks(plan, tier, n_expert)
        self.tier, self.cost = tier, cost
        self.rule = Tier(core, tier, cost, initial=first, mech=mech)
        self.counts = TierCounts()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="moeslots-stage")
        self._job: "concurrent.futures.Future[list[tuple[int, int, int]]] | None" = None
        self._queue: list[tuple[int, int]] = []          # (layer, expert) decided, not staged yet
        self._seen = self._written(read(0))              # rows written before the tier began

    def _written(self, st: RoutingStats) -> int:
        return int(st.picks_prompt.sum() + st.picks_decode.sum()) // self.k

    # -- per decode step ------------------------------------------------------------------------------------

    def step(self, n_new: int) -> SlotPlan | None:
        """After a decode step of n_new tokens (between decodes): run the step's tokens through the rule (they were
        computed with the residents of before this call), commit the copies that are in (resident from the next
        decode), stage what the rule decided. Returns the new plan when residents changed, else None."""
        for ids in self._tokens(n_new):
            s = self.rule.step(ids)
            c = self.counts
            c.tokens += 1
            c.core_hits, c.tier_hits = c.core_hits + s.core_hits, c.tier_hits + s.tier_hits
            c.cpu += ids.size - s.core_hits - s.tier_hits                  # picks (a mapped trace may repeat one)
            c.decided += len(s.prefetches)
            self._queue += [(self.layers[l], e) for l, e, _ in s.prefetches]
        plan = self._commit()
        if self._job is None and self._queue:
            jobs, self._queue = self._queue, []
            ptr = self.model_ptr
            self._job = self._pool.submit(lambda: [(il, e, _stage(ptr, il, e)) for il, e in jobs])
        return plan

    def _tokens(self, n_new: int) -> list[np.ndarray]:
        """The decode tokens written since the last step, as ids [L, k] per token in order (a row set per position;
        a position decoded again, as after a rejected MTP draft, counts again: its picks were computed again)."""
        want = (n_new + 16) * (len(self.layers) + 2)
        st = self.read(want)
        written = self._written(st)
        new, self._seen = written - self._seen, written
        rows = st.ring[len(st.ring) - min(max(new, 0), len(st.ring)):]
        col = self._colmap[np.clip(rows[:, 1], 0, self._colmap.size - 1)]
        keep = (rows[:, 0] >= 0) & (col >= 0) & (rows[:, 1] < self._colmap.size)
        rows, col = rows[keep], col[keep]
        if not len(rows):
            return []
        pos, inv = np.unique(rows[:, 0], return_inverse=True)
        ids = np.full((pos.size, len(self.layers), self.k), -1, np.int64)
        ids[inv, col] = rows[:, 2:2 + self.k]                   # a (pos, layer) written twice: its last row
        ok = ((ids >= 0) & (ids < self.n_expert)).all(axis=(1, 2))
        return list(ids[ok])

    def _commit(self, wait: bool | None = None) -> SlotPlan | None:
        job = self._job
        if job is None or not ((self.wait if wait is None else wait) or job.done()):
            return None
        self._job = None
        layers = dict(self.plan.layers)
        changed = False
        try:
            for il, e, nbytes in job.result():
                j = self.col[il]
                if nbytes < 0:
                    self.rule.drop(j)
                    self.counts.failed += 1
                    continue
                slots = list(layers[il])
                slot = slots.index(self.rule.pending[j][1])   # the engine's tier is always full: a victim leaves
                cache_mod.commit(self.model_ptr, il, slot)
                self.rule.land(j)
                slots[slot] = e
                layers[il] = tuple(slots)
                self.counts.landed += 1
                self.counts.bytes += nbytes
                changed = True
        finally:                                         # a failed commit: the plan is what the cache holds
            if changed:
                self.plan = SlotPlan(layers)
        return self.plan if changed else None

    # -- lifetime -------------------------------------------------------------------------------------------

    def drain(self) -> SlotPlan | None:
        """Wait for the copy in flight and commit it (between decodes); what was decided and not staged is dropped.
        Returns the new plan when residents changed."""
        plan = self._commit(wait=True)
        for il, _ in self._queue:
            self.rule.drop(self.col[il])
        self._queue = []
        return plan

    def close(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            try:
                job.result()
            except cache_mod.CacheError:
                pass
        self._pool.shutdown(wait=True)

    def split(self) -> tuple[float, float, float, float]:
        """Per decode token: core picks, tier picks, CPU picks, tier uploads (landed)."""
        c = self.counts
        n = max(1, c.tokens)
        return c.core_hits / n, c.tier_hits / n, c.cpu / n, c.landed / n


def masks(plan: SlotPlan, tier: int, n_expert: int) -> tuple[np.ndarray, np.ndarray]:
    """The plan's core and the tier's first residents as masks [layers in order, n_expert]: per layer its first
    S - tier slots, and its last `tier` (plans from profiles list the best-ranked experts first)."""
    layers = sorted(plan.layers)
    core = np.zeros((len(layers), n_expert), bool)
    first = np.zeros_like(core)
    for j, il in enumerate(layers):
        slots = plan.slots_of(il)
        core[j, list(slots[:len(slots) - tier])] = True
        first[j, list(slots[len(slots) - tier:])] = True
    return core, first


def _stage(model_ptr: int, il: int, e: int) -> int:
    try:
        return cache_mod.stage(model_ptr, il, e)
    except cache_mod.CacheError:
        return -1
