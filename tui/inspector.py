"""The inspector pane: speed, MTP state, the GPU/host split, uploads, the what-if line and the slot heatmap, drawn
from one engine snapshot. A widget is touched only when what it shows changed: a Static's update re-lays out the
screen, and during a reply most lines (load line, last reply's tok/s, uploads) stay the same for seconds."""

from __future__ import annotations

from typing import Any, Callable

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Digits, Label, Sparkline, Static

from ..engine.api import Snapshot
from .widgets.heatmap import SlotHeatmap
from .widgets.splitbar import SplitBar


class Inspector(Vertical):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._shown: dict[str, Any] = {}
        self.updates = 0                        # widget updates made (tests: an unchanged snapshot makes none)

    def compose(self) -> ComposeResult:
        yield Label("Inspector", classes="title")
        yield Static("", id="load-line")
        with Horizontal(id="speed"):
            yield Digits("0.0", id="toks")
            yield Label("tok/s", id="toks-unit")
        yield Sparkline([], id="toks-history")
        yield Static("", id="prompt-speed")
        yield Static("", id="mtp")
        yield SplitBar(id="split")
        yield Static("", id="uploads")
        yield Static("", id="whatif")
        yield Static("", id="hover")
        yield SlotHeatmap(id="heatmap")

    def on_mount(self) -> None:
        self.query_one("#mtp").display = False

    def _put(self, key: str, value: Any, apply: Callable[[Any], None]) -> None:
        if self._shown.get(key, ...) != value:
            self._shown[key] = value
            apply(value)
            self.updates += 1

    def show(self, snap: Snapshot) -> None:
        q = self.query_one
        self._put("load", snap.load_line, q("#load-line", Static).update)
        self._put("toks", f"{snap.tok_s_last:.1f}", q("#toks", Digits).update)
        self._put("history", tuple(snap.tok_s_rolling) or (0.0,),
                  lambda v: setattr(q("#toks-history", Sparkline), "data", list(v)))
        mtp_line = snap.mtp_line
        acc = (f"   MTP accept {snap.mtp_accepted / snap.mtp_drafted:.2f}"
               if snap.mtp_drafted and not mtp_line else "")
        reread = ("   re-read the whole chat (recurrent memory: no checkpoint fit)"
                  if snap.reread else "")
        self._put("prompt", f"prompt {snap.prompt_tok_s:.0f} tok/s{acc}{reread}", q("#prompt-speed", Static).update)
        self._put("mtp", mtp_line, self._show_mtp)
        self._put("share", round(snap.gpu_share, 3), lambda v: setattr(q(SplitBar), "share", v))
        self._put("uploads", f"uploaded/token {snap.upload_mb_per_token:.1f} MB   CPU experts/token "
                  f"{snap.cpu_experts_per_token:.1f}   pack {snap.pack_bytes / 2**20:.0f} MiB",
                  q("#uploads", Static).update)
        n_rp = snap.repicks
        repick = (f"   re-picks {n_rp}: {snap.repick_swaps} swaps, {snap.repick_mb:.0f} MB "
                  f"({snap.repick_mb / n_rp:.1f} MB each)" if n_rp else "")
        if snap.repick_auto:
            every = snap.repick_every
            repick += f"   auto: {f'every {every}' if every else 'static'}"
        self._put("whatif", snap.whatif + repick, q("#whatif", Static).update)
        self._put("heatmap", tuple((ls.layer, ls.slot_experts, ls.slot_hits_recent, ls.recent_miss_share)
                                   for ls in snap.layers), lambda v: q(SlotHeatmap).update_layers(list(v)))

    def _show_mtp(self, line: str) -> None:
        w = self.query_one("#mtp", Static)
        w.update(line)
        w.display = bool(line)

    def hover(self, text: str) -> None:
        self.query_one("#hover", Static).update(text)
