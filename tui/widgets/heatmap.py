"""The slot heatmap: one row per layer, one cell per slot (colour = recent hits of the expert in that slot), and
the layer's recent miss share. Line API: one cached Strip per layer; only rows whose data changed are rebuilt."""

from __future__ import annotations

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.color import Color, Gradient
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

LEVELS = 16
CELL = 2                       # characters per slot
LABEL = 4                      # "L00 "


class SlotHeatmap(ScrollView):
    COMPONENT_CLASSES = {"heatmap--label", "heatmap--miss"}
    DEFAULT_CSS = """
    SlotHeatmap { height: 1fr; }
    SlotHeatmap > .heatmap--label { color: $text-muted; }
    SlotHeatmap > .heatmap--miss { color: $warning; }
    """
    sorted_view: reactive[bool] = reactive(False)

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._rows: list[tuple[int, tuple[int, ...], tuple[int, ...], float]] = []   # layer, experts, hits, miss
        self._strips: dict[int, Strip] = {}
        self._styles: list[Style] = []
        self._label_style: Style | None = None
        self._segments: dict[tuple[int, int], Segment] = {}   # (colour level, run length) -> segment
        self._miss_style: Style | None = None

    def on_mount(self) -> None:
        self._build_styles()

    def _build_styles(self) -> None:
        theme = self.app.current_theme
        low = Color.parse(theme.background or "#202020")
        high = Color.parse(theme.accent or "#ffa62b")
        grad = Gradient((0.0, low), (1.0, high))
        self._styles = [Style(bgcolor=grad.get_color(i / (LEVELS - 1)).rich_color) for i in range(LEVELS)]
        self._segments = {}

    def watch_sorted_view(self, _: bool) -> None:
        self._strips.clear()
        self.refresh()

    def update_layers(self, rows: list[tuple[int, tuple[int, ...], tuple[int, ...], float]]) -> None:
        """rows: per layer (layer, slot experts, recent hits per slot, recent miss share)."""
        old = {r[0]: r for r in self._rows}
        self._rows = rows
        width = max((len(r[1]) for r in rows), default=0) * CELL + LABEL + 10
        self.virtual_size = Size(width, len(rows))
        for y, r in enumerate(rows):
            if old.get(r[0]) != r:
                self._strips.pop(y, None)
                self.refresh(Region(0, y - int(self.scroll_offset.y), self.size.width, 1))

    def cell_at(self, x: int, y: int) -> tuple[int, int, int, int] | None:
        """(layer, slot, expert, hits) under a cell, for hover text."""
        if not 0 <= y < len(self._rows):
            return None
        layer, experts, hits, _ = self._rows[y]
        slot = (x - LABEL) // CELL
        if x < LABEL or not 0 <= slot < len(experts):
            return None
        order = self._order(hits)
        s = order[slot]
        return layer, s, experts[s], hits[s]

    def _order(self, hits: tuple[int, ...]) -> list[int]:
        idx = list(range(len(hits)))
        return sorted(idx, key=lambda i: (-hits[i], i)) if self.sorted_view else idx

    def render_line(self, y: int) -> Strip:
        row = y + int(self.scroll_offset.y)
        if row >= len(self._rows):
            return Strip.blank(self.size.width)
        if row not in self._strips:
            self._strips[row] = self._build(row)
        strip = self._strips[row]
        x0 = int(self.scroll_offset.x)
        if x0 == 0 and strip.cell_length <= self.size.width:
            return strip
        return strip.crop(x0, x0 + self.size.width)

    def _build(self, row: int) -> Strip:
        if not self._styles:
            self._build_styles()
        if self._label_style is None:
            self._label_style = self.get_component_rich_style("heatmap--label")
            self._miss_style = self.get_component_rich_style("heatmap--miss")
        layer, experts, hits, miss = self._rows[row]
        segs = [Segment(f"L{layer:02d} ", self._label_style)]
        if hits:
            h = np.asarray(hits, dtype=np.float64)
            if self.sorted_view:
                h = h[np.lexsort((np.arange(h.size), -h))]
            peak = h.max() if h.max() > 0 else 1.0
            lvl = np.minimum(LEVELS - 1, np.rint(h / peak * (LEVELS - 1))).astype(np.int64)
            # one segment per run of equal colour
            edges = np.flatnonzero(np.diff(lvl)) + 1
            starts = np.r_[0, edges]
            ends = np.r_[edges, lvl.size]
            cache = self._segments
            for a, b, v in zip(starts.tolist(), ends.tolist(), lvl[starts].tolist()):
                seg = cache.get((v, b - a))
                if seg is None:
                    seg = cache[(v, b - a)] = Segment(" " * (CELL * (b - a)), self._styles[v])
                segs.append(seg)
        tail = f" miss {100 * miss:3.0f} %"
        segs.append(Segment(tail, self._miss_style))
        return Strip(segs, cell_length=LABEL + CELL * len(hits) + len(tail))
