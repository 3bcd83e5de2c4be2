"""The one window every routing figure of the inspector counts: the decode picks since the last slot or policy change.

The native counters (engine.stats) run from the context's start. Figures taken from them straight (the split, CPU
experts per token, the what-if line's static hit rate) mixed every slot count the chat had had, while the heatmap's
miss column counted the recent ring: at 256 of 256 slots the layers said miss 0 % and the split host 56 %.
`Window` keeps a baseline of the counters at each change (Engine.apply_plan; engine.residency when F3 ends a tier or
changes the re-pick interval) and gives every figure over the picks since then, of the trunk's MoE layers only (the
NextN block's experts never sit in slots), per decoded row: each row the target decodes (MTP verify rows and
rejected drafts included) picks k experts in each of those layers, so CPU experts per token is at most layers x k
and every share lies in 0..1.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..native.routing_stats import RoutingStats
from .recent_routing import LayerView, layer_views
from .record import whatif_line

if TYPE_CHECKING:
    from ..llm.facts import ModelFacts
    from ..native.expert_cache import SlotPlan

LOAD, SLOTS, POLICY = "load", "the slots changed", "the policy changed"      # what began a window


@dataclasses.dataclass(frozen=True)
class Figures:
    """The routing figures over one window (Window.figures)."""

    since: str                            # what began it
    st: RoutingStats                      # its counters (int64; zero outside the trunk MoE layers) and ring rows
    trunk: tuple[int, ...]                # the trunk's MoE layers
    per_row: int                          # expert picks per decoded row: k x len(trunk)
    uploaded: int                         # weight bytes copied to the GPU in it
    whatif: str                           # the what-if line for it ("" none)

    @property
    def rows(self) -> float:
        """Decoded rows: the trunk's picks over k x layers (hits + misses: the picks the split counts)."""
        return int(self.st.hits.sum() + self.st.misses.sum()) / self.per_row if self.per_row else 0.0

    @property
    def tokens(self) -> int:
        return round(self.rows)

    @property
    def gpu_share(self) -> float:
        return self.st.hit_rate

    @property
    def cpu_per_token(self) -> float:
        """Experts computed in host memory per decoded row: misses / rows, at most k x layers."""
        return int(self.st.misses.sum()) / self.rows if self.rows else 0.0

    @property
    def split_per_token(self) -> tuple[float, float, float]:
        """Static slots: (slot picks, 0 tier, CPU picks) per decoded row; they add up to k x layers."""
        n = self.rows
        return (int(self.st.hits.sum()) / n, 0.0, self.cpu_per_token) if n else (0.0, 0.0, 0.0)

    @property
    def upload_mb_per_token(self) -> float:
        return self.uploaded / self.rows / 1e6 if self.rows else 0.0

    def layer_views(self, counts: np.ndarray, slots_of: Callable[[int], tuple[int, ...]]) -> list[LayerView]:
        """Per trunk layer (engine.recent.layer_views): its hit and miss shares and per-slot picks over this window;
        the slots' colours stay the recent ring's hits."""
        return layer_views(counts, self.st, slots_of, list(self.trunk), window=True)


class Window:
    """The baseline of the counters at the last change, and the what-if line computed for the window since."""

    def __init__(self, facts: "ModelFacts", n_layer_all: int) -> None:
        self.trunk = tuple(il for il in facts.moe_layers if il < facts.n_layer)
        self.k, self.n_expert = facts.n_expert_used, facts.n_expert
        self._mask = np.zeros(n_layer_all, bool)
        self._mask[list(self.trunk)] = True
        z = np.zeros(n_layer_all, np.int64)
        self._base = RoutingStats(np.zeros((n_layer_all, facts.n_expert), np.int64),
                                  np.zeros((n_layer_all, facts.n_expert), np.int64), z, z.copy(),
                                  np.zeros((0, 2 + self.k), np.int32))
        self.since, self.whatif, self.epoch = LOAD, "", 0
        self._written = 0                     # ring rows written before the window began
        self._uploaded = 0                    # the engine's uploaded bytes then

    def mark(self, st: RoutingStats, since: str, uploaded: int, whatif: str = "") -> None:
        """A change (under the engine's lock): a new window from these counters on; whatif: an estimate for it."""
        self._base = RoutingStats(st.picks_prompt.astype(np.int64), st.picks_decode.astype(np.int64),
                                  st.hits.astype(np.int64), st.misses.astype(np.int64), st.ring[:0])
        self._written, self._uploaded = self._rows_written(st), uploaded
        self.since, self.whatif, self.epoch = since, whatif, self.epoch + 1

    def _rows_written(self, st: RoutingStats) -> int:
        return int(st.picks_prompt.sum() + st.picks_decode.sum()) // max(1, self.k)

    def view(self, st: RoutingStats) -> RoutingStats:
        """The counters since the mark, the trunk's only, and the ring's decode rows of the trunk written since. A
        stats reset (counters below the baseline) starts the window again from zero."""
        if any((a.astype(np.int64) < b).any() for a, b in ((st.hits, self._base.hits),
                                                           (st.misses, self._base.misses))):
            self.mark(RoutingStats(np.zeros_like(st.picks_prompt), np.zeros_like(st.picks_decode),
                                   np.zeros_like(st.hits), np.zeros_like(st.misses), st.ring),
                      self.since, self._uploaded, self.whatif)
        d = [np.where(self._mask if a.ndim == 1 else self._mask[:, None], a.astype(np.int64) - b, 0)
             for a, b in ((st.picks_prompt, self._base.picks_prompt), (st.picks_decode, self._base.picks_decode),
                          (st.hits, self._base.hits), (st.misses, self._base.misses))]
        new = self._rows_written(st) - self._written
        ring = st.ring[max(0, len(st.ring) - new):] if new > 0 else st.ring[:0]
        ring = ring[(ring[:, 0] >= 0) & self._mask[np.clip(ring[:, 1], 0, len(self._mask) - 1)]]
        return RoutingStats(d[0], d[1], d[2], d[3], ring)

    def figures(self, st: RoutingStats, uploaded: int) -> Figures:
        """Every routing figure over the window (snapshot(), under the engine's lock)."""
        return Figures(self.since, self.view(st), self.trunk, self.k * len(self.trunk),
                       max(0, uploaded - self._uploaded), self.whatif)

    def after_reply(self, st: RoutingStats, plan: "SlotPlan") -> None:
        """The what-if line measured on the window's own rows (the generating thread, after a reply: a Python loop
        over tokens). Too few rows yet: the estimate made at the change stays, for these same slots; a change
        meanwhile (F3 from the app's thread) wins."""
        epoch = self.epoch
        line = whatif_line(self.view(st), plan, self.n_expert)
        if line is not None and epoch == self.epoch:
            self.whatif = line
