"""The slot heatmap: one row per layer — its label, its recent miss share, then its slots (colour = recent hits of
the expert in each slot). It fits the panel's width at any slot count: two columns per slot while they fit, then
one, then several slots merged per column (their mean hits; the header says how many), so the miss column is never
pushed off-screen (Qwen3.6: 256 experts per layer). Layers scroll under a fixed header line (40-48+ layers).

Line API: one cached Strip per layer, rebuilt only when its data or the width changed. The mouse over it posts
Hovered with what is under it (the inspector shows it in its hover line)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.color import Color, Gradient
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

LEVELS = 16
MISS = 5                       # " 12% "
HEADER = 1                     # rows above the layers (not scrolled)

Row = tuple[int, tuple[int, ...], tuple[int, ...], float]     # layer, slot experts, recent hits per slot, miss share


@dataclasses.dataclass(frozen=True)
class Scale:
    label: int                 # label columns ("L47 ")
    per: int                   # slots per column group
    cw: int                    # columns per group (2 while two per slot fit, else 1)
    groups: int                # groups in a row

    @property
    def cells_x(self) -> int:
        return self.label + MISS


def scale_for(width: int, n_slots: int, max_layer: int) -> Scale:
    label = max(4, len(f"L{max_layer:02d}") + 1)
    area = max(1, width - label - MISS)
    if n_slots == 0:
        return Scale(label, 1, 2, 0)
    if 2 * n_slots <= area:
        return Scale(label, 1, 2, n_slots)
    per = math.ceil(n_slots / area)
    return Scale(label, per, 1, math.ceil(n_slots / per))


class SlotHeatmap(ScrollView):
    COMPONENT_CLASSES = {"heatmap--label", "heatmap--miss", "heatmap--header"}
    DEFAULT_CSS = """
    SlotHeatmap { height: 1fr; scrollbar-size-horizontal: 0; }
    SlotHeatmap > .heatmap--label { color: $text-muted; }
    SlotHeatmap > .heatmap--miss { color: $warning; }
    SlotHeatmap > .heatmap--header { color: $text-muted; text-style: italic; }
    """
    sorted_view: reactive[bool] = reactive(False)

    class Hovered(Message):
        """The mouse is over something the heatmap can describe (describe_at)."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._rows: list[Row] = []
        self._strips: dict[int, Strip] = {}
        self._styles: list[Style] = []
        self._segments: dict[tuple[int, int], Segment] = {}   # (colour level, width) -> segment
        self._scale = Scale(4, 1, 2, 0)

    def on_mount(self) -> None:
        self._build_styles()

    def _build_styles(self) -> None:
        theme = self.app.current_theme
        low, high = Color.parse(theme.background or "#202020"), Color.parse(theme.accent or "#ffa62b")
        grad = Gradient((0.0, low), (1.0, high))
        self._styles = [Style(bgcolor=grad.get_color(i / (LEVELS - 1)).rich_color) for i in range(LEVELS)]
        self._segments = {}

    @property
    def scale(self) -> Scale:
        return self._scale

    def watch_sorted_view(self, _: bool) -> None:
        self._strips.clear()
        self.refresh()

    def on_resize(self) -> None:
        self._rescale()

    def _rescale(self) -> bool:
        n = max((len(r[1]) for r in self._rows), default=0)
        s = scale_for(self.size.width, n, max((r[0] for r in self._rows), default=0))
        self.virtual_size = Size(self.size.width, len(self._rows) + HEADER)
        if s == self._scale:
            return False
        self._scale = s
        self._strips.clear()
        self.refresh()
        return True

    def update_layers(self, rows: list[Row]) -> None:
        """rows: per layer (layer, slot experts, recent hits per slot, recent miss share)."""
        old = self._rows
        self._rows = rows
        if self._rescale() or len(old) != len(rows):
            self._strips.clear()
            self.refresh()
            return
        top = int(self.scroll_offset.y)
        for y, r in enumerate(rows):
            if old[y] != r:
                self._strips.pop(y, None)
                self.refresh(Region(0, y + HEADER - top, self.size.width, 1))

    # -- hover ------------------------------------------------------------------------------------------------

    def on_mouse_move(self, event: events.MouseMove) -> None:
        off = event.get_content_offset(self)
        text = self.describe_at(off.x, off.y) if off is not None else None
        if text:
            self.post_message(self.Hovered(text))

    def describe_at(self, x: int, y: int) -> str | None:
        """What is under (x, y) of the visible area: a cell, a miss share, the header; None for nothing."""
        if y < HEADER:
            return self._header_text()
        row = y - HEADER + int(self.scroll_offset.y)
        if not 0 <= row < len(self._rows):
            return None
        layer, experts, hits, miss = self._rows[row]
        s = self._scale
        if x < s.label:
            return f"layer {layer}"
        if x < s.cells_x:
            return f"layer {layer}: {100 * miss:.0f} % of its recent expert picks missed the slots (computed on host)"
        g = (x - s.cells_x) // s.cw
        if not 0 <= g < s.groups:
            return None
        order = self._order(hits)[g * s.per:(g + 1) * s.per]
        if not order:
            return None
        n_hits = sum(hits[i] for i in order)
        if len(order) == 1:
            return f"layer {layer} · slot {order[0]} · expert {experts[order[0]]} · {n_hits} recent hits"
        ids = ", ".join(str(experts[i]) for i in order)
        which = "by hits" if self.sorted_view else f"{order[0]}–{order[-1]}"
        return f"layer {layer} · {len(order)} slots ({which}) · experts {ids} · {n_hits} recent hits"

    def _order(self, hits: tuple[int, ...]) -> list[int]:
        idx = list(range(len(hits)))
        return sorted(idx, key=lambda i: (-hits[i], i)) if self.sorted_view else idx

    # -- drawing ----------------------------------------------------------------------------------------------

    def _header_text(self) -> str:
        s, n = self._scale, max((len(r[1]) for r in self._rows), default=0)
        if not n:
            return "no slots: every expert is computed on the host"
        what = "slots by recent hits" if self.sorted_view else "slots"
        per = f", {s.per} per cell" if s.per > 1 else ""
        return f"{what} 0–{n - 1}{per}; colour = recent hits"

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y < HEADER:
            s = self._scale
            text = f"{'':{s.label}}{'miss':>4} {self._header_text()}" if self._rows else ""
            return Strip([Segment(text[:width].ljust(width), self.get_component_rich_style("heatmap--header"))], width)
        row = y - HEADER + int(self.scroll_offset.y)
        if row >= len(self._rows):
            return Strip.blank(width)
        if row not in self._strips:
            self._strips[row] = self._build(row)
        return self._strips[row].crop_extend(0, width, None)

    def _build(self, row: int) -> Strip:
        if not self._styles:
            self._build_styles()
        s = self._scale
        layer, _, hits, miss = self._rows[row]
        segs = [Segment(f"L{layer:02d}".ljust(s.label), self.get_component_rich_style("heatmap--label")),
                Segment(f"{100 * miss:3.0f}% ", self.get_component_rich_style("heatmap--miss"))]
        if hits:
            h = np.asarray(hits, dtype=np.float64)
            if self.sorted_view:
                h = h[np.lexsort((np.arange(h.size), -h))]
            pad = s.groups * s.per - h.size
            g = np.nanmean(np.r_[h, np.full(pad, np.nan)].reshape(s.groups, s.per), axis=1)
            peak = g.max() if g.max() > 0 else 1.0
            lvl = np.minimum(LEVELS - 1, np.rint(g / peak * (LEVELS - 1))).astype(np.int64)
            edges = np.flatnonzero(np.diff(lvl)) + 1                 # one segment per run of equal colour
            starts, ends = np.r_[0, edges], np.r_[edges, lvl.size]
            cache = self._segments
            for a, b, v in zip(starts.tolist(), ends.tolist(), lvl[starts].tolist()):
                w = s.cw * (b - a)
                seg = cache.get((v, w))
                if seg is None:
                    seg = cache[(v, w)] = Segment(" " * w, self._styles[v])
                segs.append(seg)
        return Strip(segs, cell_length=s.cells_x + s.cw * s.groups)
