"""Streaming a reply onto the screen at a bounded rate, with work per update that does not grow with the reply.

The generating thread only appends text to a `ReplyBuffer` (a clock read, a lock and a list append per token:
it must never wait on the UI; the count and the times give the live tok/s). The app takes what came at most every
`STREAM_EVERY` seconds, further apart when the redraws cost more than `UI_BUDGET` of a core (`Pacer`), and hands
it to a `ReplyView`: finished Markdown blocks (up to a blank line outside a code fence, or a closing fence) go to
the Markdown widget, which parses from its last block on; the unfinished block is shown as plain text by
`LiveTail`, which keeps the wrapped rows of its finished lines and re-wraps only the line being written. When the
reply ends the Markdown widget renders the whole text once.

Before this the app posted a message every 40 ms and the Markdown widget re-parsed and re-highlighted the open
block (a code block being written grew with the reply) each time: the UI thread was busy a third of the time the
reply took and decode ran at half the engine's speed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable

from rich.segment import Segment
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from .mdtext import doctest_fences

STREAM_EVERY = 0.1        # seconds between screen updates of a streaming reply: at most 10 per second
STREAM_SLOWEST = 0.5      # at least 2 per second
UI_BUDGET = 0.12          # share of one core the UI thread may spend while a reply streams


class Pacer:
    """When the next update of a streaming reply is due: the UI thread's CPU time since the last update (that
    update's layout and redraw, inspector refreshes, input) over UI_BUDGET, within [STREAM_EVERY, STREAM_SLOWEST].
    A redraw costs ~15 ms on the 2-core box (Textual lays out and repaints the scrolled chat), so a model decoding
    900 tok/s there gets about 6 updates a second and its decoding keeps its core; where redraws are cheap, 10."""

    def __init__(self, every: float = STREAM_EVERY, slowest: float = STREAM_SLOWEST, budget: float = UI_BUDGET,
                 cpu: Any = time.thread_time) -> None:
        self.every, self.slowest, self.budget, self._cpu = every, slowest, budget, cpu
        self.start()

    def start(self) -> None:
        """A reply begins (call from the UI thread, which the CPU clock measures)."""
        self._last = self._cpu()
        self.cost: float | None = None          # smoothed UI CPU seconds per update interval

    def next_delay(self) -> float:
        now = self._cpu()
        spent, self._last = now - self._last, now
        self.cost = spent if self.cost is None else 0.5 * self.cost + 0.5 * spent
        return min(self.slowest, max(self.every, self.cost / self.budget))


class ReplyBuffer:
    """Text from the generating thread, taken by the UI thread; and how fast it comes (the live tok/s the
    inspector shows while a reply streams: the engine's own figure comes only with the reply's end)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._parts: list[str] = []
        self._pieces = 0                     # pieces put since reset(): one per decoded token (the engine
        self._first: float | None = None     # yields a piece per token, a rare empty one is merged), and
        self._last = 0.0                     # when the first and the latest came

    def reset(self) -> None:
        """A reply begins: no text, nothing counted."""
        with self._lock:
            self._parts, self._pieces, self._first, self._last = [], 0, None, 0.0

    def put(self, text: str) -> None:
        now = self._clock()                  # outside the lock: the UI thread never waits on the clock
        with self._lock:
            self._parts.append(text)
            self._pieces += 1
            if self._first is None:
                self._first = now
            self._last = now

    def take(self) -> str:
        with self._lock:
            parts, self._parts = self._parts, []
        return "".join(parts)

    def rate(self) -> float | None:
        """Pieces per second since the first one (the pieces after it over the time they took): the reply's
        decode speed so far, without its prompt time; None until two pieces came."""
        with self._lock:
            n, first, last = self._pieces, self._first, self._last
        if first is None or n < 2 or last <= first:
            return None
        return (n - 1) / (last - first)


class BlockSplitter:
    """Finds where the finished Markdown blocks of a growing text end; looks at each line once."""

    def __init__(self) -> None:
        self.tail = ""                 # text after the last finished block
        self._scanned = 0              # tail[:_scanned] is whole lines already looked at
        self._fence = ""               # the open code fence's marker ("```", "~~~~", ...), "" outside fences

    def feed(self, text: str) -> str:
        """Add text; returns the blocks it finished (to go to the Markdown widget), "" if none."""
        self.tail += text
        cut = 0
        while True:
            nl = self.tail.find("\n", self._scanned)
            if nl < 0:
                break
            line = self.tail[self._scanned:nl].strip()
            self._scanned = nl + 1
            if self._fence:
                if line.startswith(self._fence) and not line.strip(self._fence[0]):
                    self._fence, cut = "", self._scanned          # the fence closed: its block is finished
            elif line.startswith(("```", "~~~")):
                ch = line[0]
                self._fence = ch * (len(line) - len(line.lstrip(ch)))
            elif not line and self._scanned > 1:
                cut = self._scanned                               # a blank line ends a block
        if not cut:
            return ""
        done, self.tail = self.tail[:cut], self.tail[cut:]
        self._scanned -= cut
        return done


class LiveTail(Widget):
    """The unfinished block of a streaming reply as plain wrapped text (line API). Appending costs the new text
    and the line it ends on; the rows of finished lines are wrapped once (again only when the width changes)."""

    DEFAULT_CSS = "LiveTail { height: auto; }"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._lines: list[str] = []    # finished lines
        self._open = ""                # the line being written
        self._rows: list[Strip] = []   # wrapped rows of the finished lines at _width
        self._open_rows: list[Strip] = []
        self._width = 0

    @property
    def text(self) -> str:
        return "\n".join([*self._lines, self._open])

    @property
    def row_count(self) -> int:
        return len(self._rows) + len(self._open_rows)

    def reset(self, text: str = "") -> None:
        self._lines, self._open, self._rows, self._open_rows = [], "", [], []
        self.append(text)

    def append(self, text: str) -> None:
        before = self.row_count
        first = len(self._rows)
        parts = text.split("\n")
        self._open += parts[0]
        if len(parts) > 1:
            finished = [self._open, *parts[1:-1]]
            self._open = parts[-1]
            self._lines.extend(finished)
            if self._width:
                for line in finished:
                    self._rows.extend(self._wrap(line))
        self._open_rows = self._wrap(self._open) if self._width and (self._open or self._lines) else []
        if self.row_count != before:
            self.refresh(layout=True)
        else:
            self.refresh(Region(0, first, self.size.width, self.row_count - first))

    def _wrap(self, line: str) -> list[Strip]:
        if not line:
            return [Strip.blank(0)]
        style = self.rich_style
        out = []
        for row in Text(line).wrap(self.app.console, self._width, overflow="fold", no_wrap=False):
            out.append(Strip([Segment(row.plain, style)], row.cell_len))
        return out or [Strip.blank(0)]

    def _rewrap(self, width: int) -> None:
        if width == self._width or width <= 0:
            return
        self._width = width
        self._rows = [r for line in self._lines for r in self._wrap(line)]
        self._open_rows = self._wrap(self._open) if self._open or self._lines else []

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._rewrap(width)
        return self.row_count

    def render_line(self, y: int) -> Strip:
        self._rewrap(self.size.width)
        n = len(self._rows)
        if y < n:
            strip = self._rows[y]
        elif y - n < len(self._open_rows):
            strip = self._open_rows[y - n]
        else:
            return Strip.blank(self.size.width)
        return strip.extend_cell_length(self.size.width, self.rich_style)


class ReplyView:
    """A streaming reply: finished blocks in the Markdown widget, the open one in a LiveTail."""

    def __init__(self, markdown: Any, tail: LiveTail) -> None:
        self.markdown, self.tail = markdown, tail
        self._split = BlockSplitter()
        self._lock = asyncio.Lock()          # a write still appending when the reply ends goes first
        self._finished = False

    async def write(self, text: str) -> None:
        async with self._lock:
            if self._finished:
                return
            done = self._split.feed(text)
            if done:
                await self.markdown.append(doctest_fences(done))     # finished blocks start outside any fence
                self.tail.reset(self._split.tail)
            else:
                self.tail.append(text)

    async def finish(self, text: str) -> None:
        """The whole reply (as mdtext.as_markdown made it), rendered once as Markdown; the tail goes."""
        async with self._lock:
            self._finished = True
            self.tail.reset()
            self.tail.display = False
            await self.markdown.update(text)
