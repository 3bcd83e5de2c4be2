"""The moeslots terminal app: chat on the left, the live cache inspector on the right (a tab on narrow terminals).

It only draws engine snapshots: every engine call runs in a worker thread; a reply's text reaches the screen ten
times a second (tui/stream.py: the generating thread never waits on the UI, an update costs the new text), the
inspector polls `engine.snapshot()` every 250 ms while visible and redraws only what changed.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any, Callable

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message as TMessage
from textual.screen import Screen
from textual.widgets import Footer, Header, Markdown, Static

from ..engine.api import Done, Engine, Message, TextDelta
from .actions import EngineActions
from .inspector import Inspector
from .screens.modals import NameScreen
from .store import Store, data_dir
from .widgets.chat import ChatMessage, Prompt, printable
from .stream import STREAM_EVERY, LiveTail, Pacer, ReplyBuffer, ReplyView
from .widgets.heatmap import SlotHeatmap


class ReplyDone(TMessage):
    def __init__(self, text: str, stats: Any, error: str | None = None) -> None:
        super().__init__()
        self.text, self.stats, self.error = text, stats, error


SWITCH_INTERVAL = 0.0001      # seconds; sys.setswitchinterval while the app runs
INSPECT_EVERY = 0.25          # seconds between inspector refreshes (while it is visible)


class MoeslotsApp(EngineActions, App[None]):
    TITLE = "moeslots"
    CSS_PATH = "app.tcss"
    BINDINGS = [
        Binding("ctrl+r", "record", "Record profile", id="record"),
        Binding("ctrl+s", "slots", "Slots", id="slots"),
        Binding("ctrl+t", "toggle_inspector", "Inspector", id="inspector"),
        Binding("ctrl+n", "new_chat", "New chat", id="new_chat"),
        Binding("ctrl+o", "sort_heatmap", "Sort slots", id="sort_heatmap", show=False),
        Binding("ctrl+e", "export", "Export chat", id="export", show=False),
        Binding("ctrl+y", "copy_last", "Copy answer", id="copy_last", show=False),
        Binding("f2", "system_prompt", "System prompt", id="system_prompt", show=False),
        Binding("f3", "toggle_repick", "Re-pick", id="repick", show=False),
        Binding("f4", "models", "Models", id="models", show=False),
        Binding("f1", "show_help_panel", "Help", id="help"),
        Binding("escape", "stop", "Stop", id="stop"),
        Binding("ctrl+q", "quit", "Quit", id="quit"),
    ]

    def __init__(self, engine: Engine, *, store: Store | None = None, model_name: str = "",
                 keymap: dict[str, str] | None = None, system_prompt: str = "", remember: bool = False):
        super().__init__()
        self.remember = remember          # write slot/profile changes to config.toml (the real app does)
        self.engine = engine
        self.store = store or Store()
        self.model_name = model_name
        self.model_path: Path | None = None          # the model file, and what opens another (the F4 picker;
        self.model_dirs: list[str] = []              # both set by the CLI) and where else to look for models
        self.opener: Callable[[Path], Engine] | None = None
        self._notices_seen = 0                       # engine notices already shown (more come after replies)
        self._keymap = keymap or {}
        self.chat_id = self.store.last_chat() or self.store.new_chat(system_prompt)
        self._cancel = threading.Event()
        self._generating = False
        self._pending_prompt = ""
        self._assistant: ChatMessage | None = None
        self._stream: ReplyView | None = None
        self._reply = ReplyBuffer()       # the generating thread puts text, _pump takes it
        self._pacer = Pacer()
        self._pump_timer: Any = None
        self._last_answer = ""
        self.last_turn: Any = None        # the last reply's TurnStats (the engine's numbers; `bench app` reads them)
        self._inspector_visible = True
        self._user_toggled = False        # once the user toggles the inspector, resizing no longer hides it
        self._repick_seen = engine.snapshot().repick_every   # the interval in force, to say when auto changes it

    # -- layout ------------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat-pane"):
                yield VerticalScroll(id="chat-log")
                yield Prompt(id="prompt")
            yield Inspector(id="inspector")
        yield Footer()

    def on_mount(self) -> None:
        if self._keymap:
            self.set_keymap(self._keymap)
        self.sub_title = self.model_name
        self.query_one("#load-line", Static).update(self.engine.load_line)
        self._say_new_notices()
        pending = self.store.pop_unanswered(self.chat_id)    # the app was closed or killed mid-reply
        for role, content in self.store.messages(self.chat_id):
            self.query_one("#chat-log").mount(ChatMessage(role, content))
            if role == "assistant":
                self._last_answer = content
        self.query_one("#chat-log").scroll_end(animate=False)
        self.query_one(Prompt).focus()
        if pending:
            self.query_one(Prompt).text = pending
            self.notify("the last reply did not finish (the app was closed mid-reply): your message is back in the "
                        "prompt, Enter sends it again", timeout=8)
        self.set_interval(INSPECT_EVERY, self.refresh_inspector)
        # a thread that wants the GIL back (the generating one, after each llama_decode) waits for the UI thread
        # to give it up at most this long: 0.1 ms instead of Python's 5 ms (docs/lab/2026-12-03-app-speed.md)
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL)
        self.on_resize()

    def on_unmount(self) -> None:
        sys.setswitchinterval(self._switch_interval)

    def on_resize(self, event: Any = None) -> None:
        narrow = self.size.width < 110
        if narrow and self._inspector_visible and not self._user_toggled:
            self._set_inspector(False)

    def _set_inspector(self, visible: bool) -> None:
        self._inspector_visible = visible
        self.screen_stack[0].query_one("#inspector").display = visible

    def get_system_commands(self, screen: Screen) -> Any:
        yield from super().get_system_commands(screen)
        for b in self.BINDINGS:
            if isinstance(b, Binding) and b.action not in ("quit", "show_help_panel"):
                yield SystemCommand(b.description, f"{b.description} ({b.key})", getattr(self, f"action_{b.action}"))

    # -- chat --------------------------------------------------------------------------------------------------

    def _messages(self) -> list[Any]:
        msgs = []
        sys_prompt = self.store.system(self.chat_id)
        if sys_prompt:
            msgs.append(Message("system", sys_prompt))
        msgs += [Message(r, c) for r, c in self.store.messages(self.chat_id)]
        return msgs

    @on(Prompt.Send)
    async def send(self, event: Prompt.Send) -> None:
        if self._generating:
            self.notify("still answering: Esc stops it", severity="warning")
            return
        text = event.text.rstrip()
        self._pending_prompt = text
        self._cancel = threading.Event()          # before any await: an Esc from now on reaches this reply
        self._generating = True
        self.query_one(Prompt).text = ""
        self.store.add(self.chat_id, "user", text)
        log = self.query_one("#chat-log", VerticalScroll)
        await log.mount(ChatMessage("user", text))
        self._assistant = ChatMessage("assistant", "", streaming=True)
        await log.mount(self._assistant)
        self._stream = ReplyView(self._assistant.query_one(Markdown), self._assistant.query_one(LiveTail))
        self._reply.take()
        log.scroll_end(animate=False)
        self._pacer.start()
        self._pump_timer = self.set_timer(STREAM_EVERY, self._pump)
        self.call_after_refresh(self.generate, self._messages(), self._cancel)   # after the new messages are drawn

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def generate(self, messages: list[Any], cancel: threading.Event) -> None:
        put = self._reply.put                              # per token: a list append, never a wait on the UI
        text, stats, error = "", None, None
        try:
            for ev in self.engine.chat(messages, cancel=cancel):
                if isinstance(ev, TextDelta):
                    put(ev.text)
                elif isinstance(ev, Done):
                    text, stats = ev.text, ev.stats
        except Exception as e:  # noqa: BLE001 - shown to the user; the chat stays usable
            error = str(e)
        self.post_message(ReplyDone(text, stats, error))

    async def _pump(self) -> None:
        """While a reply streams: what came since the last update, onto the screen; then the next one is due
        after STREAM_EVERY or more (tui/stream.py's Pacer keeps the UI thread within its CPU budget)."""
        if self._stream is None:
            return
        text = self._reply.take()
        if text:
            await self._stream.write(printable(text))
            log = self.query_one("#chat-log", VerticalScroll)
            if log.max_scroll_y - log.scroll_y < 4:          # follow only when the user is near the bottom
                log.scroll_end(animate=False)
        if self._stream is not None:
            self._pump_timer = self.set_timer(self._pacer.next_delay(), self._pump)

    @on(ReplyDone)
    async def reply_done(self, event: ReplyDone) -> None:
        if self._pump_timer is not None:
            self._pump_timer.stop()
        stream, self._stream = self._stream, None
        self._reply.take()
        cancelled = bool(event.stats and event.stats.cancelled)
        self.last_turn = event.stats
        if event.error:
            self.notify(f"generation failed: {event.error}", severity="error", timeout=10)
        if stream is not None:
            await stream.finish(printable(event.text))
        elif self._assistant is not None:
            await self._assistant.query_one(Markdown).update(printable(event.text))
        if cancelled and not event.text.strip():
            # nothing said: take the question back out of the chat
            if self._assistant is not None:
                await self._assistant.remove()
            await self._drop_last_user_message()
        elif event.text or not event.error:
            self.store.add(self.chat_id, "assistant", event.text)
            self._last_answer = event.text
        if cancelled and not self.query_one(Prompt).text.strip():
            self.query_one(Prompt).text = self._pending_prompt    # Esc puts the prompt back, to edit and resend
        self._say_new_notices()
        self._say_auto_switch()
        self._assistant = None
        self._generating = False                  # last: the reply is fully settled (store, log, prompt)
        self.query_one(Prompt).focus()

    async def _drop_last_user_message(self) -> None:
        self.store.drop_last_user_message(self.chat_id)
        users = [m for m in self.query_one("#chat-log").query(ChatMessage) if m.role == "user"]
        if users:
            await users[-1].remove()

    def action_stop(self) -> None:
        if self._generating:
            self._cancel.set()

    async def action_new_chat(self) -> None:
        if self._generating:
            self.notify("stop the reply first (Esc)", severity="warning")
            return
        self.chat_id = self.store.new_chat(self.store.system(self.chat_id))
        await self.query_one("#chat-log").remove_children()
        self.new_chat_engine()
        self.notify("new chat")

    @work(thread=True, group="engine")
    def new_chat_engine(self) -> None:
        self.engine.new_chat()

    def action_copy_last(self) -> None:
        if self._last_answer:
            self.copy_to_clipboard(self._last_answer)
            self.notify("last answer copied")

    def action_export(self) -> None:
        out = data_dir() / "exports" / f"chat-{self.chat_id}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.store.export_markdown(self.chat_id))
        self.notify(f"exported to {out}")

    @work(exclusive=True, group="modal")
    async def action_system_prompt(self) -> None:
        text = await self.push_screen_wait(NameScreen("System prompt for this chat (empty: none):",
                                                      self.store.system(self.chat_id)))
        if text is not None:
            self.store.set_system(self.chat_id, text)
            self.notify("system prompt set" if text else "system prompt cleared")

    def _say_new_notices(self) -> None:
        """The engine's notices not shown yet (at start; after a reply, e.g. the automatic profile's)."""
        notices = list(self.engine.notices)
        for n in notices[self._notices_seen:]:
            self.notify(n, timeout=8)
        self._notices_seen = len(notices)

    def action_toggle_inspector(self) -> None:
        self._user_toggled = True
        self._set_inspector(not self._inspector_visible)

    def action_sort_heatmap(self) -> None:
        hm = self.query_one(SlotHeatmap)
        hm.sorted_view = not hm.sorted_view

    # -- inspector ---------------------------------------------------------------------------------------------

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
        rec = f" ● REC {self.engine.recorded_tokens} tok" if snap.recording else ""
        slots = len(snap.layers[0].slot_experts) if snap.layers else 0
        mtp = f" · MTP {snap.mtp_accepted}/{snap.mtp_drafted}" if snap.mtp_drafted else ""
        title = f"moeslots · {slots} slots{mtp}{rec}"
        if self.title != title:
            self.title = title
        base.query_one(Inspector).show(snap)

    def on_mouse_move(self, event: Any) -> None:
        if self.screen is not self.screen_stack[0]:
            return
        hm = self.query_one(SlotHeatmap)
        off = event.get_content_offset(hm)
        if off is None:
            return
        cell = hm.cell_at(off.x, off.y + int(hm.scroll_offset.y))
        if cell:
            layer, slot, expert, hits = cell
            self.query_one(Inspector).hover(f"layer {layer} · slot {slot} · expert {expert} · {hits} recent hits")

    async def action_quit(self) -> None:
        self._cancel.set()
        self.exit()


def load_keymap() -> dict[str, str]:
    """[keymap] of config.toml: binding id -> keys (e.g. record = "ctrl+g")."""
    from . import config

    try:
        return dict(config.load().get("keymap", {}))
    except config.ConfigError as e:
        raise ValueError(str(e)) from None
