"""The inspector pane: the profile and policy in force, speed, MTP state, the GPU/host split, uploads, the what-if
line, the slot heatmap and a legend, drawn from one engine snapshot. A widget is touched only when what it shows
changed: a Static's update re-lays out the screen, and during a reply most lines (load line, last reply's tok/s,
uploads) stay the same for seconds.

Values measured at another slot count than the one in force (the last reply's tok/s and split after Ctrl+S, a
what-if line for other slots) are marked stale: dimmed, with the slot count they were measured at. An engine that
counts its routing figures over one window (engine.window_stats: the split, CPU experts and uploads per token, the
what-if line and the heatmap's miss column, all since the last slot or policy change) says which: the line above the
split states it, and its split is never stale (it starts again at each change).

The inspector refreshes itself: every INSPECT_EVERY seconds while it is shown it reads the App's engine through
`source` (a snapshot and what the App knows beside it, View) and redraws what changed; its `headline` (slots, MTP,
recording) is the app's title, which the App watches. The heatmap's hover lands in its hover line."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.reactive import var
from textual.widgets import Digits, Label, Sparkline, Static

from ..engine.api import Snapshot
from ..profiles.policy import TIERED
from .widgets.heatmap import SlotHeatmap
from .widgets.splitbar import SplitBar

INSPECT_EVERY = 0.25          # seconds between refreshes (while the inspector is shown)

LEGEND = ("[b]colour[/b] a slot's recent hits (dark: none, bright: the layer's most) · [b]miss[/b] picks not in a "
          "slot, computed on host · [b]what-if[/b] hit % of these slots vs LRU / re-elect-16 · [b]MTP a/d[/b] (title) "
          "drafts accepted/drafted · [dim]dim[/dim]: measured at other slots · hover for more")

TIPS = {
    "profile": "the routing profile the slots were chosen from, and how they change: static (fixed), re-pick every "
               "N tokens (F3), or --repick auto's choice",
    "load-line": "layers x slots per layer in the expert cache, and the bytes uploaded to hold them",
    "speed": "decode tokens/s: while a reply streams, its own so far (live: tokens since its first over the time "
             "they took), then the engine's figure for the whole reply; the sparkline: recent replies",
    "prompt-speed": "prompt (prefill) tokens/s of the last reply; MTP acceptance",
    "mtp": "MTP drafting: on while its acceptance beats the measured break-even, else off with a probe later",
    "window": "the split, uploads and CPU experts per token, the what-if line and the heatmap's miss column all "
              "count the same decode tokens: those since the last slot or policy change (tokens: rows the model "
              "decoded, MTP verify rows included)",
    "split": "share of the decode expert picks served from slots vs computed from host memory",
    "uploads": "with a dynamic tier (--policy hybrid|dynamic|fetch|fetch-split): expert picks per token served by "
               "the static slots, by the tier and on the CPU, and the misses uploaded into the tier per token "
               "(computed on the GPU in the same token; with fetch the GPU reads them itself, and the CPU computes "
               "only the misses of verify batches too large for the tier; with fetch-split the CPU computes a share "
               "of every token's misses while the GPU reads the others); then weight bytes copied to the GPU per "
               "decode token (0 with a static cache), experts computed on the CPU per token, the slot pack's size",
    "whatif": "the profiles simulator on the recent routing: the static plan's hit rate (measured; est.: simulated "
              "for slots just changed) beside LRU and re-electing every 16 tokens with the same slots",
    "heatmap": "one row per layer: label, miss share (over the window above), then its slots coloured by recent hits "
               "(merged when they do not fit: the header says how many per cell); hover a cell for its experts",
}


@dataclasses.dataclass(frozen=True)
class View:
    """What the inspector shows beside the snapshot (the app knows it, the snapshot does not)."""

    profile: str = ""                  # the active profile's file name ("" none)
    measured_at: int | None = None     # slots in force when the last reply ran (None: no reply yet)
    live: bool = False                 # a reply is streaming: the speed shown is live_tok_s once known
    live_tok_s: float | None = None    # its decode rate so far (None: fewer than two tokens yet: the last reply's)
    recorded: int = 0                  # decode tokens recorded so far (while recording a profile)


Source = Callable[[], "tuple[Snapshot, View] | None"]     # the engine's snapshot now and the App's View (None: no
                                                          # engine to read, e.g. closing)


def slots_of(snap: Snapshot) -> int:
    return len(snap.layers[0].slot_experts) if snap.layers else 0


def window_of(snap: Snapshot) -> tuple[str, int] | None:
    """The window the snapshot's routing figures count: (what began it, decoded tokens in it); None from an engine
    that keeps none (the tests' fakes)."""
    return (snap.window_since, snap.window_tokens) if snap.window_since else None


def window_line(since: str, tokens: int) -> str:
    """e.g. "since the slots changed: 37 tokens"."""
    return f"since {since}: {tokens} token{'' if tokens == 1 else 's'}"


def headline(snap: Snapshot, recorded: int) -> str:
    """The app's title: "moeslots · 64 slots · MTP 7/10 drafts accepted · ● REC 120 tok"."""
    rec = f" · ● REC {recorded} tok" if snap.recording else ""
    mtp = f" · MTP {snap.mtp_accepted}/{snap.mtp_drafted} drafts accepted" if snap.mtp_drafted else ""
    return f"moeslots · {slots_of(snap)} slots{mtp}{rec}"


def policy(snap: Snapshot) -> str:
    if snap.policy in TIERED:
        return snap.policy_line or (f"{snap.policy}: {snap.tier_slots} tier slots per layer"
                                    if snap.policy != "dynamic" else "dynamic: every slot follows the routing")
    if snap.policy_line and snap.policy_line.startswith("auto"):
        return snap.policy_line
    if snap.repick_auto:
        return f"auto: {f're-pick every {snap.repick_every}' if snap.repick_every else 'static'}"
    return f"re-pick every {snap.repick_every}" if snap.repick_every else "static slots"


class Inspector(Vertical):
    headline: var[str] = var("", init=False)     # the app's title (see headline()), once drawn

    def __init__(self, source: Source | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.source = source
        self._shown: dict[str, Any] = {}
        self.updates = 0                        # widget updates made (tests: an unchanged snapshot makes none)
        self._unit = "tok/s"                    # the speed's unit label as shown

    def compose(self) -> ComposeResult:
        yield Label("Inspector", classes="title")
        yield Static("", id="profile")
        yield Static("", id="load-line")
        with Horizontal(id="speed"):
            yield Digits("0.0", id="toks")
            yield Label("tok/s", id="toks-unit")
        yield Sparkline([], id="toks-history")
        yield Static("", id="prompt-speed")
        yield Static("", id="mtp")
        yield Static("", id="window")
        yield SplitBar(id="split")
        yield Static("", id="uploads")
        yield Static("", id="whatif")
        yield Static("", id="hover")
        yield SlotHeatmap(id="heatmap")
        yield Static(LEGEND, id="legend")

    def on_mount(self) -> None:
        self.query_one("#mtp").display = False
        self.query_one("#window").display = False
        for wid, tip in TIPS.items():
            self.query_one(f"#{wid}").tooltip = tip
        self.set_interval(INSPECT_EVERY, self.poll)

    def poll(self) -> None:
        """A refresh, while shown (no work while hidden)."""
        if not self.display or not self.is_attached or not self.app.is_running:
            return
        try:
            self.draw()
        except NoMatches:                               # mounting or tearing down
            pass

    def draw(self) -> None:
        """The engine now, drawn (only what changed is touched)."""
        reading = self.source() if self.source is not None else None
        if reading is None:
            return
        snap, view = reading
        self.headline = headline(snap, view.recorded)
        self.show(snap, view)

    def on_slot_heatmap_hovered(self, event: SlotHeatmap.Hovered) -> None:
        self.hover(event.text)

    def _put(self, key: str, value: Any, apply: Callable[[Any], None]) -> None:
        if self._shown.get(key, ...) != value:
            self._shown[key] = value
            apply(value)
            self.updates += 1

    def show(self, snap: Snapshot, view: View = View()) -> None:
        q = self.query_one
        now = slots_of(snap)
        live = view.live and view.live_tok_s is not None      # streaming, two tokens in: the reply's rate so far
        stale = not live and view.measured_at is not None and view.measured_at != now      # live: measured now
        self._put("profile", f"profile {view.profile or 'none'} · {policy(snap)}", q("#profile", Static).update)
        self._put("load", snap.load_line + (f"\n{snap.progress.strip()}" if snap.progress else ""),
                  q("#load-line", Static).update)
        toks = view.live_tok_s if live and view.live_tok_s is not None else snap.tok_s_last
        self._put("toks", f"{toks:.1f}", q("#toks", Digits).update)
        self._put("stale", (stale, view.measured_at, live), self._show_stale)
        self._put("history", tuple(snap.tok_s_rolling) or (0.0,),
                  lambda v: setattr(q("#toks-history", Sparkline), "data", list(v)))
        mtp_line = snap.mtp_line
        acc = (f"   MTP accept {min(1.0, max(0.0, snap.mtp_accepted / snap.mtp_drafted)):.2f}"
               if snap.mtp_drafted and not mtp_line else "")
        reread = ("   re-read the whole chat (recurrent memory: no checkpoint fit)"
                  if snap.reread else "")
        self._put("prompt", f"prompt {snap.prompt_tok_s:.0f} tok/s{acc}{reread}", q("#prompt-speed", Static).update)
        self._put("mtp", mtp_line, self._show_mtp)
        window = window_of(snap)
        self._put("window", window, self._show_window)
        # a windowed split counts from the last change: never measured at other slots; an empty one says so
        self._put("split", (stale and window is None, view.measured_at, window is not None and window[1] == 0),
                  self._show_split)
        self._put("share", round(snap.gpu_share, 3), lambda v: setattr(q(SplitBar), "share", v))
        core, tier, cpu = snap.split_per_token
        tiered = (f"per token: slots {core:.1f} · tier {tier:.1f} · CPU {cpu:.1f} experts, "
                  f"{snap.tier_uploads_per_token:.2f} into the tier\n" if snap.tier_slots else "")
        self._put("uploads", f"{tiered}uploaded/token {snap.upload_mb_per_token:.1f} MB   CPU experts/token "
                  f"{snap.cpu_experts_per_token:.1f}   pack {snap.pack_bytes / 2**20:.0f} MiB",
                  q("#uploads", Static).update)
        n_rp = snap.repicks
        repick = (f"   re-picks {n_rp}: {snap.repick_swaps} swaps, {snap.repick_mb:.0f} MB "
                  f"({snap.repick_mb / n_rp:.1f} MB each)" if n_rp else "")
        self._put("whatif", (snap.whatif, repick, now), self._show_whatif)
        self._put("heatmap", tuple((ls.layer, ls.slot_experts, ls.slot_hits_recent, ls.recent_miss_share)
                                   for ls in snap.layers), lambda v: q(SlotHeatmap).update_layers(list(v)))

    def _show_stale(self, v: tuple[bool, int | None, bool]) -> None:
        stale, at, live = v
        self.query_one("#speed").set_class(stale, "stale")
        unit = f"tok/s\n(at {at} slots)" if stale else "tok/s\nlive" if live else "tok/s"
        widths = {len(max(u.split("\n"), key=len)) for u in (unit, self._unit)}
        self._unit = unit
        self.query_one("#toks-unit", Label).update(unit, layout=len(widths) > 1)   # live on/off: no re-layout
                                                                                   # (same width, fixed height)

    def _show_split(self, v: tuple[bool, int | None, bool]) -> None:
        stale, at, empty = v
        split = self.query_one(SplitBar)
        split.set_class(stale or empty, "stale")
        split.note = f" (at {at} slots)" if stale else " (no tokens yet)" if empty else ""

    def _show_window(self, v: tuple[str, int] | None) -> None:
        w = self.query_one("#window", Static)
        w.update(window_line(*v) if v is not None else "")
        w.display = v is not None

    def _show_whatif(self, v: tuple[str, str, int]) -> None:
        line, repick, now = v
        m = re.match(r"what-if @(\d+)", line)
        stale = m is not None and int(m.group(1)) != now
        w = self.query_one("#whatif", Static)
        w.set_class(stale, "stale")
        w.update((f"{line} (stale: now {now} slots)" if stale else line) + repick)

    def _show_mtp(self, line: str) -> None:
        w = self.query_one("#mtp", Static)
        w.update(line)
        w.display = bool(line)

    def hover(self, text: str) -> None:
        self.query_one("#hover", Static).update(text)
