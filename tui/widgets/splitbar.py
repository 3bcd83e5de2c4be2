"""A one-line bar: share of expert work served from VRAM (slots) vs computed in host memory."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget


class SplitBar(Widget):
    DEFAULT_CSS = "SplitBar { height: 1; }"
    share: reactive[float] = reactive(0.0)
    note: reactive[str] = reactive("")         # e.g. " (at 16 slots)": measured at another slot count

    def render(self) -> Text:
        head = "experts: slots "
        tail = f" {100 * self.share:3.0f} % host {100 * (1 - self.share):3.0f} %{self.note}"
        width = max(10, self.size.width - len(head) - len(tail))
        n = round(self.share * width)
        t = Text(head)
        t.append("█" * n, style="bold green")
        t.append("░" * (width - n), style="dim")
        t.append(tail)
        return t
