"""The moeslots terminal app: chat on the left, the live cache inspector on the right (40% of the width, 44 to 70
columns: the chat keeps the rest; below 110 columns it is hidden, and Ctrl+T shows it in place of the chat, as a
tab). On a small screen (under 110x30) what the app has to say at start is one line each in the chat pane, not
toasts over it.

Built by composition: the App owns the engine, the history store and the layout, and handles what its parts post
(tui/messages.py). The chat pane (tui/chatpane.py) owns the open chat and the reply being written; the inspector
(tui/inspector.py) refreshes itself from the engine every 250 ms while shown, and its heatmap describes what the
mouse is over; the chat keys that open dialogs are tui/chatkeys.py, the engine keys tui/actions.py (plain objects
the App owns), switching models (F4) tui/modelswitch.py (a worker: the App swaps its engine when it posts
EngineSwitched), the keys and their ids tui/keys.py, dialogs tui/screens/. Every engine call runs in a worker
thread; a reply's text reaches the screen ten times a second (tui/stream.py: the generating thread never waits on
the UI).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Coroutine

from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal
from textual.notifications import SeverityLevel
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ..engine.api import Engine, Snapshot, TurnStats
from . import keys
from .actions import EngineActions
from .chatkeys import ChatKeys
from .chatpane import ChatPane
from .inspector import Inspector, View, slots_of
from .messages import EngineSwitched, Notice, ReplyDone
from .modelswitch import ModelSwitch, Opener
from .screens.help import HelpScreen
from .store import Store
from .widgets.chat import ChatLog, Prompt, printable
from .widgets.heatmap import SlotHeatmap

__all__ = ["MoeslotsApp", "Prompt", "ReplyDone", "load_keymap", "printable"]

SWITCH_INTERVAL = 0.0001      # seconds; sys.setswitchinterval while the app runs
NARROW = 110                  # columns below which the inspector is hidden (Ctrl+T: shown instead of the chat)
SHORT = 30                    # rows below which (or under NARROW columns) start-up notices go in the chat pane
APP_ACTIONS = {b.action for b in keys.BINDINGS}
ANY_SCREEN = {"quit", "help"}                  # app keys that work while a dialog is open


class MainScreen(Screen[None]):
    """The chat and the inspector. Back here from a dialog, the chat catches up with the reply it follows."""

    def on_screen_resume(self) -> None:
        self.call_after_refresh(self.query_one(ChatLog).stick)


class MoeslotsApp(App[None]):
    TITLE = "moeslots"
    CSS_PATH = "app.tcss"
    # the app's keys, and Textual's own Ctrl+C under the app's (when no reply runs, check_action lets it through)
    BINDINGS = [*keys.BINDINGS, Binding("ctrl+c", "help_quit", show=False, system=True)]
    # another model is being opened (F4): busy meanwhile. Not bindings=True, as ChatPane.state says why
    switching: reactive[bool] = reactive(False, repaint=False, init=False)

    def __init__(self, engine: Engine, *, store: Store | None = None, model_name: str = "",
                 keymap: dict[str, str] | None = None, system_prompt: str = "", remember: bool = False):
        super().__init__()
        self.engine = engine
        self.store = store or Store()
        self.model_name = model_name
        self.model_path: Path | None = None          # the model file, and what opens another (the F4 picker;
        self.model_dirs: list[str] = []              # both set by the CLI) and where else to look for models
        self.opener: Opener | None = None            # (path, progress=...) -> a new engine
        self.keymap = dict(keymap or {})
        self.last_turn: TurnStats | None = None   # the last reply's stats (the engine's numbers; `bench app` reads)
        self.measured_at: int | None = None       # slots in force when the last reply ran (the inspector's stale marks)
        # a chat belongs to the model it was made with: this model's last chat, else a new one
        chat = self.store.last_chat(model_name) or self.store.new_chat(system_prompt, model=model_name)
        self.chat_pane = ChatPane(lambda: self.engine, self.store, chat, model_name=model_name, keymap=self.keymap,
                                  id="chat-pane")
        self.inspector = Inspector(self._reading, id="inspector")
        self.chat_keys = ChatKeys(self.chat_pane)
        self.engine_actions = EngineActions(self, lambda: self.engine, keymap=self.keymap, remember=remember)
        self.model_switch = ModelSwitch(self, self._swap_engine)
        self._inspector_visible = True
        self._narrow: bool | None = None          # the width class the inspector's visibility was last set for
        self._start_notes: list[tuple[str, dict[str, Any]]] | None = []   # notify() while mounting (None after)

    # -- layout ------------------------------------------------------------------------------------------------

    def get_default_screen(self) -> Screen[Any]:
        return MainScreen(id="_default")

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield self.chat_pane
            yield self.inspector
        yield Footer()

    async def on_mount(self) -> None:
        self.watch(self.chat_pane, "subtitle", self._show_subtitle)      # (the inspector may have drawn already:
        self.watch(self.inspector, "headline", self._show_headline)      # the App's resize comes first)
        if self.keymap:
            self.set_keymap(self.keymap)
            for line in keys.keymap_problems(self.keymap):
                self.notify(line, severity="warning", timeout=12)
        self.query_one("#load-line", Static).update(self.engine.load_line)
        self.engine_actions.say_new_notices()
        pane = self.chat_pane
        pending = self.store.pop_unanswered(pane.chat_id)    # the app was closed or killed mid-reply
        await pane.show_chat(pane.chat_id)
        pane.prompt.focus()
        if pending:
            pane.prompt.restore(pending)
            self.notify("the last reply did not finish (the app was closed mid-reply): your message is back in the "
                        "prompt, Enter sends it again", timeout=8)
        await self._show_start_notes()
        # a thread that wants the GIL back (the generating one, after each llama_decode) waits for the UI thread
        # to give it up at most this long: 0.1 ms instead of Python's 5 ms
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL)
        self.on_resize()

    def _show_subtitle(self, text: str) -> None:
        self.sub_title = text

    def _show_headline(self, text: str) -> None:
        if text:                                   # ("": not drawn yet, the title stays)
            self.title = text

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
        await self.chat_pane.show_notices([(message, str(kw["severity"])) for message, kw in notes])

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
        tab = bool(visible and self._narrow)            # narrow: the inspector takes the chat's place
        self.inspector.display = visible
        self.inspector.set_class(tab, "tab")
        self.chat_pane.display = not tab
        self.chat_pane.show_inspector_hint(visible)    # the welcome text says where it is, or the key that shows it
        if visible:
            self.inspector.poll()
        elif self.screen is self.screen_stack[0]:
            self.chat_pane.prompt.focus()
        self.call_after_refresh(self.chat_pane.stick)   # the chat re-wraps at its new width: still at the bottom

    def _reading(self) -> tuple[Snapshot, View] | None:
        """What the inspector draws: the engine's snapshot, and beside it what the App and the chat pane know."""
        try:
            snap = self.engine.snapshot()
        except Exception:  # noqa: BLE001 - e.g. the engine is closing
            return None
        profile = self.engine.profile
        live = self.chat_pane.generating     # while a reply streams: its own tok/s so far, from the text stream
        return snap, View(profile.name if profile else "", self.measured_at, live,
                          self.chat_pane.reply.rate() if live else None, self.engine.recorded_tokens)

    # -- keys -------------------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A reply runs, or another model is being opened: the chat and engine keys wait."""
        return self.chat_pane.generating or self.switching

    def _refuse_busy(self) -> bool:
        if self.busy:
            self.notify(f"stop the reply first ({keys.keys_of('stop', self.keymap)})", severity="warning")
        return self.busy

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """App keys are priority bindings (they work from the prompt box); under a dialog they are off, so its
        fields and buttons get the keys — except quit, and the help key closing the help screen. Ctrl+C
        (interrupt) is on only while a reply runs: else the prompt box copies, or Textual says how to quit."""
        if action == "interrupt":
            return self.chat_pane.generating and self.screen is self.screen_stack[0]
        if action not in APP_ACTIONS or self.screen is self.screen_stack[0]:
            return True
        return action == "quit" or (action == "help" and isinstance(self.screen, HelpScreen))

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
        elif self.screen is self.screen_stack[0]:
            self.push_screen(HelpScreen(self.keymap))

    def get_system_commands(self, screen: Screen[Any]) -> Any:
        for cmd in super().get_system_commands(screen):
            if cmd.title != "Keys":                      # Textual's generic key panel: F1 shows the app's keys
                yield cmd
        for b in keys.BINDINGS:       # each once, its second line what it does and its keys (not its name again)
            if b.action not in ("quit", "interrupt") and b.id is not None:      # (interrupt: Stop is there)
                yield SystemCommand(b.description, keys.palette_help(b.id, self.keymap),
                                    getattr(self, f"action_{b.action}"))

    def action_toggle_inspector(self) -> None:
        self._set_inspector(not self._inspector_visible)

    def action_sort_heatmap(self) -> None:
        hm = self.inspector.query_one(SlotHeatmap)
        hm.sorted_view = not hm.sorted_view

    def action_stop(self) -> None:
        self.chat_pane.stop()

    def action_interrupt(self) -> None:
        """Ctrl+C while a reply runs: stop it, as Esc does."""
        self.chat_pane.stop()

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded:       # a key as it came from the terminal
            self._esc_read_as_alt(event)
        await super().on_event(event)

    def _esc_read_as_alt(self, event: events.Key) -> None:
        """Esc is also the first byte of every escape sequence: Textual's input parser waits ESCDELAY (100 ms) for
        more, and Esc with a key typed within that time (a new question begun at once) reaches the app as one
        Alt+key whose character the prompt box types: the Esc was lost and the reply went on. While a reply runs,
        an Alt+character no key is bound to stops it as Esc would, and still types its character."""
        pane = self.chat_pane
        if (pane.generating and not pane.cancel.is_set() and event.key.startswith("alt+") and event.is_printable
                and self.screen is self.screen_stack[0] and event.key not in self.screen.active_bindings):
            pane.stop()

    async def action_quit(self) -> None:
        self.chat_pane.cancel.set()
        self.exit()

    # the chat keys (tui/chatpane.py, tui/chatkeys.py); dialogs run as workers (they wait for the dialog)

    async def action_regenerate(self) -> None:
        if not self._refuse_busy():
            await self.chat_pane.regenerate()

    async def action_edit_last(self) -> None:
        if not self._refuse_busy():
            await self.chat_pane.edit_last()

    async def action_new_chat(self) -> None:
        if not self._refuse_busy():
            await self.chat_keys.new_chat()

    def action_chats(self) -> None:
        if not self._refuse_busy():
            self._modal(self.chat_keys.chats())

    def action_system_prompt(self) -> None:
        self._modal(self.chat_keys.system_prompt())

    def action_sampling(self) -> None:
        self._modal(self.chat_keys.sampling())

    def action_copy_last(self) -> None:
        self.chat_keys.copy_last()

    def action_copy_code(self) -> None:
        self.chat_keys.copy_code()

    def action_export(self) -> None:
        self.chat_keys.export()

    # the engine keys (tui/actions.py)

    def action_slots(self) -> None:
        if not self._refuse_busy():
            self._modal(self.engine_actions.slots())

    def action_record(self) -> None:
        self._modal(self.engine_actions.record())

    def action_toggle_repick(self) -> None:
        self.engine_actions.toggle_repick()

    def _modal(self, work: Coroutine[Any, Any, None]) -> None:
        """A dialog's work as a worker (it waits for the dialog): one at a time, a new one replacing the last."""
        self.run_worker(work, exclusive=True, group="modal")

    def on_notice(self, event: Notice) -> None:
        self.notify(event.text, severity=event.severity, timeout=event.timeout)

    # -- a reply ended ------------------------------------------------------------------------------------------

    async def on_reply_done(self, event: ReplyDone) -> None:
        """After the chat pane put the reply in its log and the history (its own handler ran first)."""
        self.last_turn = event.stats
        if event.said and event.stats is not None and event.stats.tokens:
            self.measured_at = self.slots_now()
        self.engine_actions.say_new_notices()
        self.engine_actions.say_auto_switch()
        await self.chat_pane.end_reply()

    def slots_now(self) -> int:
        try:
            return slots_of(self.engine.snapshot())
        except Exception:  # noqa: BLE001 - e.g. the engine is closing
            return 0

    # -- another model (F4): tui/modelswitch.py ---------------------------------------------------------------

    def action_models(self) -> None:
        """The model picker; the path it returns is switched to (switch_model)."""
        if not self._refuse_busy():
            self.model_switch.pick(self.model_dirs, self.model_path, self.switch_model)

    def switch_model(self, path: Path) -> None:
        if self.model_path is not None and path.resolve() == self.model_path.resolve():
            self.notify(f"{path.name} is the model in use")
            return
        if self.opener is None:
            self.notify(f"this app cannot open another model: run `moeslots chat {path}`", severity="warning")
            return
        self.notify(f"opening {path.name}…")
        self.switching = True                  # busy until on_engine_switched: no reply, slot change or new chat
        self.chat_pane.hold = f"{path.name} is open"
        self.model_switch.start(path, self.opener, self.model_path)

    def _swap_engine(self, engine: Engine) -> Engine:
        old, self.engine = self.engine, engine
        return old

    async def on_engine_switched(self, event: EngineSwitched) -> None:
        path = event.path
        self.engine, self.model_path, self.model_name = event.engine, path, path.name
        self.switching = False
        self.engine_actions.engine_changed()
        if event.error:
            self.notify(event.error, severity="error", timeout=12)
        await self.chat_pane.model_switched(path.name, own_chat=not event.error)
        self.engine_actions.say_new_notices()
        self.inspector.poll()
        await self.chat_pane.send_queued()

    # -- what the tests (and `moeslots chat`'s exit) read of the parts: read-only, forwarded -------------------

    @property
    def chat_id(self) -> int:
        return self.chat_pane.chat_id

    @property
    def chat_log(self) -> ChatLog:
        return self.chat_pane.chat_log

    def refresh_inspector(self) -> None:
        self.inspector.poll()

    def _draw_inspector(self) -> None:
        self.inspector.draw()


def load_keymap() -> dict[str, str]:
    """[keymap] of config.toml: binding id -> keys (e.g. record = "ctrl+g")."""
    from . import config

    try:
        return dict(config.load().get("keymap", {}))
    except config.ConfigError as e:
        raise ValueError(str(e)) from None
