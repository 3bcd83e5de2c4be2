"""The moeslots terminal app: chat on the left, the live cache inspector on the right (40% of the width, 44 to 70
columns: the chat keeps the rest; below 110 columns it is hidden, and Ctrl+T shows it in place of the chat, as a
tab). On a small screen (under 110x30) what the app has to say at start is one line each in the chat pane, not
toasts over it.

It only draws engine snapshots: every engine call runs in a worker thread; a reply's text reaches the screen ten
times a second (tui/stream.py: the generating thread never waits on the UI, an update costs the new text), the
inspector polls `engine.snapshot()` every 250 ms while visible and redraws only what changed. The chat itself is
tui/chatflow.py, the engine keys tui/actions.py, the keys and their ids tui/keys.py, dialogs tui/screens/.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any, Callable

from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header, Static

from ..engine.api import Engine, TurnStats
from . import keys
from .actions import EngineActions
from .chatflow import ChatFlow, ReplyDone
from .inspector import Inspector, View, slots_of
from .screens.help import HelpScreen
from .store import Store
from .stream import Pacer, ReplyBuffer, ReplyView
from .widgets.chat import ChatLog, ChatMessage, Notices, Prompt, Welcome, printable
from .widgets.heatmap import SlotHeatmap

__all__ = ["MoeslotsApp", "Prompt", "ReplyDone", "load_keymap", "printable"]

SWITCH_INTERVAL = 0.0001      # seconds; sys.setswitchinterval while the app runs
INSPECT_EVERY = 0.25          # seconds between inspector refreshes (while it is visible)
NARROW = 110                  # columns below which the inspector is hidden (Ctrl+T: shown instead of the chat)
SHORT = 30                    # rows below which (or under NARROW columns) start-up notices go in the chat pane
APP_ACTIONS = {b.action for b in keys.BINDINGS}
ANY_SCREEN = {"quit", "help"}                  # app keys that work while a dialog is open


class MainScreen(Screen[None]):
    """The chat and the inspector. Back here from a dialog, the chat catches up with the reply it follows."""

    def on_screen_resume(self) -> None:
        app = self.app
        if isinstance(app, MoeslotsApp):
            app.call_after_refresh(app.chat_log.stick)


class MoeslotsApp(ChatFlow, EngineActions, App[None]):
    TITLE = "moeslots"
    CSS_PATH = "app.tcss"
    # the app's keys, and Textual's own Ctrl+C under the app's (when no reply runs, check_action lets it through)
    BINDINGS = [*keys.BINDINGS, Binding("ctrl+c", "help_quit", show=False, system=True)]

    def __init__(self, engine: Engine, *, store: Store | None = None, model_name: str = "",
                 keymap: dict[str, str] | None = None, system_prompt: str = "", remember: bool = False):
        super().__init__()
        self.remember = remember          # write slot/profile changes to config.toml (the real app does)
        self.engine = engine
        self.store = store or Store()
        self.model_name = model_name
        self.model_path: Path | None = None          # the model file, and what opens another (the F4 picker;
        self.model_dirs: list[str] = []              # both set by the CLI) and where else to look for models
        self.opener: Callable[..., Engine] | None = None     # (path, progress=...) -> a new engine
        self._notices_seen = 0                       # engine notices already shown (more come after replies)
        self._keymap = dict(keymap or {})
        # a chat belongs to the model it was made with: this model's last chat, else a new one
        self.chat_id = self.store.last_chat(model_name) or self.store.new_chat(system_prompt, model=model_name)
        self._cancel = threading.Event()
        self._generating = False
        self._pending_prompt = ""         # the question being answered (Esc before any text gives it back)
        self._queued = ""                 # Enter while a reply runs or stops: sent once it has ended
        self._assistant: ChatMessage | None = None
        self._stream: ReplyView | None = None
        self._reply = ReplyBuffer()       # the generating thread puts text, _pump takes it
        self._pacer = Pacer()
        self._pump_timer: Timer | None = None
        self._last_answer = ""
        self.last_turn: TurnStats | None = None   # the last reply's stats (the engine's numbers; `bench app` reads)
        self.measured_at: int | None = None       # slots in force when the last reply ran (the inspector's stale marks)
        self._inspector_visible = True
        self._narrow: bool | None = None          # the width class the inspector's visibility was last set for
        self._repick_seen = engine.snapshot().repick_every   # the interval in force, to say when auto changes it
        self._start_notes: list[tuple[str, dict[str, Any]]] | None = []   # notify() while mounting (None after)

    # -- layout ------------------------------------------------------------------------------------------------

    def get_default_screen(self) -> Screen[Any]:
        return MainScreen(id="_default")

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat-pane"):
                yield ChatLog(id="chat-log")
                yield Prompt(id="prompt")
            yield Inspector(id="inspector")
        yield Footer()

    async def on_mount(self) -> None:
        if self._keymap:
            self.set_keymap(self._keymap)
            for line in keys.keymap_problems(self._keymap):
                self.notify(line, severity="warning", timeout=12)
        self.query_one("#load-line", Static).update(self.engine.load_line)
        self._say_new_notices()
        pending = self.store.pop_unanswered(self.chat_id)    # the app was closed or killed mid-reply
        await self.show_chat(self.chat_id)
        self.query_one(Prompt).focus()
        if pending:
            self.query_one(Prompt).restore(pending)
            self.notify("the last reply did not finish (the app was closed mid-reply): your message is back in the "
                        "prompt, Enter sends it again", timeout=8)
        self.set_interval(INSPECT_EVERY, self.refresh_inspector)
        await self._show_start_notes()
        # a thread that wants the GIL back (the generating one, after each llama_decode) waits for the UI thread
        # to give it up at most this long: 0.1 ms instead of Python's 5 ms (docs/lab/2026-12-03-app-speed.md)
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL)
        self.on_resize()

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """A toast, as App.notify; while the app mounts, kept for _show_start_notes (all of them at once, in the
        chat pane on a small screen)."""
        kw: dict[str, Any] = dict(title=title, severity=severity, timeout=timeout, markup=markup)
        if self._start_notes is not None:
            self._start_notes.append((str(message), kw))
            return
        super().notify(message, **kw)

    async def _show_start_notes(self) -> None:
        """What was said while the app mounted (the engine's notices, the history's, a bad keymap, a question
        given back): toasts on a large screen; on a small one (at 80x24 five toasts covered half of it) one line
        each at the end of the chat pane, a click shows them whole."""
        notes, self._start_notes = self._start_notes or [], None
        if not notes:
            return
        if self.size.width >= NARROW and self.size.height >= SHORT:
            for message, kw in notes:
                super().notify(message, **kw)
            return
        await self.chat_log.mount(Notices([(message, str(kw["severity"])) for message, kw in notes]))
        self.call_after_refresh(self.chat_log.stick)

    def on_unmount(self) -> None:
        sys.setswitchinterval(self._switch_interval)

    def on_resize(self, event: Any = None) -> None:
        """Crossing NARROW columns (either way) sets the inspector's default for the new width: shown when wide,
        hidden when narrow; Ctrl+T overrides it until the next crossing. (The event's size: this handler runs
        before App's own, which sets self.size — reading that kept the inspector on a narrowed terminal.)"""
        narrow = (event.size if event is not None else self.size).width < NARROW
        if narrow != self._narrow:
            self._narrow = narrow
            self._set_inspector(not narrow)

    def _set_inspector(self, visible: bool) -> None:
        self._inspector_visible = visible
        base = self.screen_stack[0]
        tab = bool(visible and self._narrow)            # narrow: the inspector takes the chat's place
        base.query_one("#inspector").display = visible
        base.query_one("#inspector").set_class(tab, "tab")
        base.query_one("#chat-pane").display = not tab
        for w in base.query(Welcome):                  # it says where the inspector is, or the key that shows it
            w.show_inspector(visible)
        if visible:
            self.refresh_inspector()
        elif self.screen is base:
            self.query_one(Prompt).focus()
        self.call_after_refresh(self.chat_log.stick)    # the chat re-wraps at its new width: still at the bottom

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """App keys are priority bindings (they work from the prompt box); under a dialog they are off, so its
        fields and buttons get the keys — except quit, and the help key closing the help screen. Ctrl+C
        (interrupt) is on only while a reply runs: else the prompt box copies, or Textual says how to quit."""
        if action == "interrupt":
            return self._generating and self.screen is self.screen_stack[0]
        if action not in APP_ACTIONS or self.screen is self.screen_stack[0]:
            return True
        return action == "quit" or (action == "help" and isinstance(self.screen, HelpScreen))

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
        elif self.screen is self.screen_stack[0]:
            self.push_screen(HelpScreen(self._keymap))

    def get_system_commands(self, screen: Screen[Any]) -> Any:
        for cmd in super().get_system_commands(screen):
            if cmd.title != "Keys":                      # Textual's generic key panel: F1 shows the app's keys
                yield cmd
        for b in keys.BINDINGS:       # each once, its second line what it does and its keys (not its name again)
            if b.action not in ("quit", "interrupt") and b.id is not None:      # (interrupt: Stop is there)
                yield SystemCommand(b.description, keys.palette_help(b.id, self._keymap),
                                    getattr(self, f"action_{b.action}"))

    def action_toggle_inspector(self) -> None:
        self._set_inspector(not self._inspector_visible)

    def action_sort_heatmap(self) -> None:
        hm = self.screen_stack[0].query_one(SlotHeatmap)
        hm.sorted_view = not hm.sorted_view

    def action_interrupt(self) -> None:
        """Ctrl+C while a reply runs: stop it, as Esc does."""
        self.action_stop()

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded:       # a key as it came from the terminal
            self._esc_read_as_alt(event)
        await super().on_event(event)

    def _esc_read_as_alt(self, event: events.Key) -> None:
        """Esc is also the first byte of every escape sequence: Textual's input parser waits ESCDELAY (100 ms) for
        more, and Esc with a key typed within that time (a new question begun at once) reaches the app as one
        Alt+key whose character the prompt box types: the Esc was lost and the reply went on. While a reply runs,
        an Alt+character no key is bound to stops it as Esc would, and still types its character."""
        if (self._generating and not self._cancel.is_set() and event.key.startswith("alt+") and event.is_printable
                and self.screen is self.screen_stack[0] and event.key not in self.screen.active_bindings):
            self.action_stop()

    async def action_quit(self) -> None:
        self._cancel.set()
        self.exit()

    # -- inspector ---------------------------------------------------------------------------------------------

    def slots_now(self) -> int:
        try:
            return slots_of(self.engine.snapshot())
        except Exception:  # noqa: BLE001 - e.g. the engine is closing
            return 0

    def _say_new_notices(self) -> None:
        """The engine's notices not shown yet (at start; after a reply, e.g. the automatic profile's)."""
        notices = list(self.engine.notices)
        for n in notices[self._notices_seen:]:
            self.notify(n, timeout=8)
        self._notices_seen = len(notices)

    def refresh_inspector(self) -> None:
        if not self._inspector_visible or not self.is_running:
            return                                      # no work while hidden
        try:
            self._draw_inspector()
        except NoMatches:                               # mounting or tearing down
            pass

    def _draw_inspector(self) -> None:
        base = self.screen_stack[0]                    # the inspector lives there, under any modal
        try:
            snap = self.engine.snapshot()
        except Exception:  # noqa: BLE001 - e.g. the engine is closing
            return
        rec = f" · ● REC {self.engine.recorded_tokens} tok" if snap.recording else ""
        mtp = f" · MTP {snap.mtp_accepted}/{snap.mtp_drafted} drafts accepted" if snap.mtp_drafted else ""
        title = f"moeslots · {slots_of(snap)} slots{mtp}{rec}"
        if self.title != title:
            self.title = title
        profile = self.engine.profile
        live = self._generating            # while a reply streams: its own tok/s so far, from the text stream
        base.query_one(Inspector).show(snap, View(profile.name if profile else "", self.measured_at, live,
                                                  self._reply.rate() if live else None))

    def on_mouse_move(self, event: Any) -> None:
        if self.screen is not self.screen_stack[0] or not self._inspector_visible:
            return
        hm = self.query_one(SlotHeatmap)
        off = event.get_content_offset(hm)
        if off is None:
            return
        text = hm.describe_at(off.x, off.y)
        if text:
            self.query_one(Inspector).hover(text)


def load_keymap() -> dict[str, str]:
    """[keymap] of config.toml: binding id -> keys (e.g. record = "ctrl+g")."""
    from . import config

    try:
        return dict(config.load().get("keymap", {}))
    except config.ConfigError as e:
        raise ValueError(str(e)) from None
