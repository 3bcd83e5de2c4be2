"""The moeslots terminal app: chat on the left, the live cache inspector on the right (a tab on narrow terminals).

It only draws engine snapshots: every engine call runs in a worker thread, tokens reach the UI in batches
(~40 ms), the inspector polls `engine.snapshot()` every 250 ms while visible.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message as TMessage
from textual.screen import Screen
from textual.widgets import Digits, Footer, Header, Label, Markdown, Sparkline, Static, TextArea

from moeslots.tui.screens.modals import NameScreen, SlotsScreen
from moeslots.tui.store import Store, data_dir
from moeslots.tui.widgets.heatmap import SlotHeatmap
from moeslots.tui.widgets.splitbar import SplitBar


class EngineLike(Protocol):
    """What the app needs from moeslots.engine.engine.Engine (tests use a scripted fake)."""
    load_line: str
    notices: list[str]

    def chat(self, messages: Any, cancel: threading.Event | None = None) -> Any: ...
    def snapshot(self) -> Any: ...
    def set_slots(self, plan_or_n: Any) -> str: ...
    def start_recording(self) -> None: ...
    def stop_recording(self, path: Path) -> Any: ...
    def new_chat(self) -> None: ...
    def close(self) -> None: ...


class Prompt(TextArea):
    """Enter sends; Shift+Enter and Ctrl+J insert a newline; Esc stops generation (handled by the app)."""

    class Send(TMessage):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    BINDINGS = [Binding("ctrl+j", "newline", "Newline", show=False, id="prompt.newline")]

    async def _on_key(self, event: Any) -> None:
        if event.key == "enter":
            event.prevent_default()
            event.stop()
            text = self.text.strip()
            if text:
                self.post_message(self.Send(self.text))
            return
        if event.key == "shift+enter":
            event.prevent_default()
            event.stop()
            self.insert("\n")
            return
        await super()._on_key(event)

    def action_newline(self) -> None:
        self.insert("\n")


class ChatMessage(Vertical):
    DEFAULT_CSS = """
    ChatMessage { height: auto; margin: 0 0 1 0; }
    ChatMessage > .who { color: $text-muted; text-style: bold; }
    ChatMessage.user > .who { color: $accent; }
    ChatMessage > Markdown { margin: 0; padding: 0; }
    """

    def __init__(self, role: str, text: str = ""):
        super().__init__(classes=role)
        self.role, self.text = role, text

    def compose(self) -> ComposeResult:
        yield Label("you ▸" if self.role == "user" else "assistant ▸", classes="who")
        yield Markdown(printable(self.text))


_CONTROL = {c: "\ufffd" for c in range(32) if c not in (9, 10)} | {127: "\ufffd"}


def printable(text: str) -> str:
    """Model text with terminal control characters (ESC, BEL, CR...) replaced: a reply must never drive the
    terminal (random-weight models emit raw byte tokens; real ones can too)."""
    return text.translate(_CONTROL)


class TokensArrived(TMessage):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class ReplyDone(TMessage):
    def __init__(self, text: str, stats: Any, error: str | None = None) -> None:
        super().__init__()
        self.text, self.stats, self.error = text, stats, error


class MoeslotsApp(App[None]):
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

    def __init__(self, engine: EngineLike, *, store: Store | None = None, model_name: str = "",
                 keymap: dict[str, str] | None = None, system_prompt: str = "", remember: bool = False):
        super().__init__()
        self.remember = remember          # write slot/profile changes to config.toml (the real app does)
        self.engine = engine
        self.store = store or Store()
        self.model_name = model_name
        self.model_path: Path | None = None          # the model file, and what opens another (the F4 picker;
        self.model_dirs: list[str] = []              # both set by the CLI) and where else to look for models
        self.opener: Callable[[Path], EngineLike] | None = None
        self._notices_seen = 0                       # engine notices already shown (more come after replies)
        self._keymap = keymap or {}
        self.chat_id = self.store.last_chat() or self.store.new_chat(system_prompt)
        self._cancel = threading.Event()
        self._generating = False
        self._pending_prompt = ""
        self._assistant: ChatMessage | None = None
        self._stream: Any = None
        self._last_answer = ""
        self.last_turn: Any = None        # the last reply's TurnStats (the engine's numbers; `bench app` reads them)
        self._inspector_visible = True
        self._user_toggled = False        # once the user toggles the inspector, resizing no longer hides it
        self._repick_seen = int(getattr(getattr(engine, "cfg", None), "repick_every", 0) or 0)

    # -- layout ------------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat-pane"):
                yield VerticalScroll(id="chat-log")
                yield Prompt(id="prompt")
            with Vertical(id="inspector"):
                yield Label("Inspector", classes="title")
                yield Static("", id="load-line")
                with Horizontal(id="speed"):
                    yield Digits("0.0", id="toks")
                    yield Label("tok/s", id="toks-unit")
                yield Sparkline([], id="toks-history")
                yield Static("", id="prompt-speed")
                yield SplitBar(id="split")
                yield Static("", id="uploads")
                yield Static("", id="whatif")
                yield Static("", id="hover")
                yield SlotHeatmap(id="heatmap")
        yield Footer()

    def on_mount(self) -> None:
        if self._keymap:
            self.set_keymap(self._keymap)
        self.sub_title = self.model_name
        self.query_one("#load-line", Static).update(self.engine.load_line)
        self._say_new_notices()
        for role, content in self.store.messages(self.chat_id):
            self.query_one("#chat-log").mount(ChatMessage(role, content))
            if role == "assistant":
                self._last_answer = content
        self.query_one("#chat-log").scroll_end(animate=False)
        self.query_one(Prompt).focus()
        self.set_interval(0.25, self.refresh_inspector)
        self.on_resize()

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
        from moeslots.engine.engine import Message

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
        self._assistant = ChatMessage("assistant", "")
        await log.mount(self._assistant)
        self._stream = Markdown.get_stream(self._assistant.query_one(Markdown))
        log.scroll_end(animate=False)
        self.generate(self._messages(), self._cancel)

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def generate(self, messages: list[Any], cancel: threading.Event) -> None:
        from moeslots.engine.engine import Done, TextDelta

        buf: list[str] = []
        last = time.monotonic()
        text, stats, error = "", None, None
        try:
            for ev in self.engine.chat(messages, cancel=cancel):
                if isinstance(ev, TextDelta):
                    buf.append(ev.text)
                    if time.monotonic() - last > 0.04:
                        self.post_message(TokensArrived("".join(buf)))
                        buf, last = [], time.monotonic()
                elif isinstance(ev, Done):
                    text, stats = ev.text, ev.stats
        except Exception as e:  # noqa: BLE001 - shown to the user; the chat stays usable
            error = str(e)
        if buf:
            self.post_message(TokensArrived("".join(buf)))
        self.post_message(ReplyDone(text, stats, error))

    @on(TokensArrived)
    async def tokens(self, event: TokensArrived) -> None:
        if self._stream is not None:
            await self._stream.write(printable(event.text))
        log = self.query_one("#chat-log", VerticalScroll)
        if log.max_scroll_y - log.scroll_y < 4:          # follow only when the user is near the bottom
            log.scroll_end(animate=False)

    @on(ReplyDone)
    async def reply_done(self, event: ReplyDone) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        cancelled = bool(event.stats and event.stats.cancelled)
        self.last_turn = event.stats
        if event.error:
            self.notify(f"generation failed: {event.error}", severity="error", timeout=10)
        if self._assistant is not None:
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
        db = self.store.db
        db.execute("DELETE FROM messages WHERE id = (SELECT MAX(id) FROM messages WHERE chat = ? AND role = 'user')",
                   (self.chat_id,))
        db.commit()
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

    # -- slots and recording -----------------------------------------------------------------------------------

    @work(exclusive=True, group="modal")
    async def action_slots(self) -> None:
        if self._generating:
            self.notify("stop the reply first (Esc)", severity="warning")
            return
        snap = self.engine.snapshot()
        cur = str(len(snap.layers[0].slot_experts)) if snap.layers and snap.layers[0].slot_experts else "0"
        info = self.engine.slots_info() if hasattr(self.engine, "slots_info") else \
            f"now: {snap.load_line}; pack {snap.pack_bytes / 2**20:.0f} MiB"
        value = await self.push_screen_wait(SlotsScreen(cur, info))
        if value is not None:
            self.apply_slots(value)

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def apply_slots(self, value: str) -> None:
        try:
            line = self.engine.set_slots(value if value == "auto" else int(value))
        except Exception as e:  # noqa: BLE001 - notified, state kept
            self.call_from_thread(self.notify, f"slots unchanged: {e}", severity="error", timeout=10)
            return
        self.call_from_thread(self.notify, line)
        if self.remember:
            from moeslots.tui import config

            try:
                config.save_app({"slots": value, "profile": str(getattr(getattr(self.engine, "cfg", None),
                                                                        "profile", "") or "") or None})
            except (OSError, config.ConfigError) as e:
                self.call_from_thread(self.notify, f"could not save the config: {e}", severity="warning")

    @work(exclusive=True, group="modal")
    async def action_record(self) -> None:
        if not self.engine.snapshot().recording:
            self.engine.start_recording()
            self.notify("recording routing: chat as usual, Ctrl+R again to save the profile")
            return
        default = str(data_dir() / "profiles" / f"profile-{time.strftime('%Y%m%d-%H%M%S')}.csv")
        name = await self.push_screen_wait(NameScreen("Save the recorded profile as:", default))
        if name is None:
            self.notify("still recording (Esc kept it going)")
            return
        try:
            t = self.engine.stop_recording(Path(name).expanduser())
        except Exception as e:  # noqa: BLE001
            self.notify(f"could not save the profile: {e}", severity="error", timeout=10)
            return
        msg = f"saved {name}: {t.decode_tokens} decode tokens, {t.n_rows} routing rows"
        ov = self.engine.profile_overlap(Path(name).expanduser()) if hasattr(self.engine, "profile_overlap") else None
        if ov is not None:
            msg += f"; top-slot overlap with the active profile {100 * ov:.0f} %"
        self.notify(msg, timeout=10)
        if t.decode_tokens and hasattr(self.engine, "use_profile"):
            answer = await self.push_screen_wait(NameScreen("Apply this profile to the slots now? (yes/no)", "yes"))
            if answer and answer.lower().startswith("y"):
                self.engine.use_profile(Path(name).expanduser())
                snap = self.engine.snapshot()
                n = len(snap.layers[0].slot_experts) if snap.layers and snap.layers[0].slot_experts else 0
                self.apply_slots(str(n) if n else "auto")

    @work(exclusive=True, group="modal")
    async def action_system_prompt(self) -> None:
        text = await self.push_screen_wait(NameScreen("System prompt for this chat (empty: none):",
                                                      self.store.system(self.chat_id)))
        if text is not None:
            self.store.set_system(self.chat_id, text)
            self.notify("system prompt set" if text else "system prompt cleared")

    def _say_auto_switch(self) -> None:
        """`--repick auto` decides again as the chat goes on (after a reply): say so when it switched."""
        try:
            snap = self.engine.snapshot()
        except Exception:  # noqa: BLE001 - e.g. the engine is closing
            return
        every, auto = int(getattr(snap, "repick_every", 0)), getattr(snap, "repick_auto", "")
        if every != self._repick_seen and auto:
            self.notify(auto, title="re-pick (auto)", timeout=12)
        self._repick_seen = every

    def _say_new_notices(self) -> None:
        """The engine's notices not shown yet (at start; after a reply, e.g. the automatic profile's)."""
        notices = list(getattr(self.engine, "notices", []))
        for n in notices[self._notices_seen:]:
            self.notify(n, timeout=8)
        self._notices_seen = len(notices)

    def action_models(self) -> None:
        from moeslots.tui.screens.models import open_picker

        open_picker(self)

    def action_toggle_repick(self) -> None:
        if not hasattr(self.engine, "set_repick"):
            return
        cfg = getattr(self.engine, "cfg", None)
        on = bool(getattr(cfg, "repick_every", 0))
        self.notify(self.engine.set_repick(0 if on else 16))
        self._repick_seen = 0 if on else 16

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
        rec = f" ● REC {getattr(self.engine, 'recorded_tokens', 0)} tok" if snap.recording else ""
        slots = len(snap.layers[0].slot_experts) if snap.layers else 0
        mtp = f" · MTP {snap.mtp_accepted}/{snap.mtp_drafted}" if snap.mtp_drafted else ""
        self.title = f"moeslots · {slots} slots{mtp}{rec}"
        base.query_one("#load-line", Static).update(snap.load_line)
        base.query_one("#toks", Digits).update(f"{snap.tok_s_last:.1f}")
        base.query_one("#toks-history", Sparkline).data = list(snap.tok_s_rolling) or [0.0]
        acc = f"   MTP accept {snap.mtp_accepted / snap.mtp_drafted:.2f}" if snap.mtp_drafted else ""
        base.query_one("#prompt-speed", Static).update(f"prompt {snap.prompt_tok_s:.0f} tok/s{acc}")
        base.query_one(SplitBar).share = snap.gpu_share
        base.query_one("#uploads", Static).update(
            f"uploaded/token {snap.upload_mb_per_token:.1f} MB   CPU experts/token {snap.cpu_experts_per_token:.1f}"
            f"   pack {snap.pack_bytes / 2**20:.0f} MiB")
        n_rp = getattr(snap, "repicks", 0)
        repick = (f"   re-picks {n_rp}: {snap.repick_swaps} swaps, {snap.repick_mb:.0f} MB "
                  f"({snap.repick_mb / n_rp:.1f} MB each)" if n_rp else "")
        if getattr(snap, "repick_auto", ""):
            every = getattr(snap, "repick_every", 0)
            repick += f"   auto: {f'every {every}' if every else 'static'}"
        base.query_one("#whatif", Static).update((getattr(snap, "whatif", "") or "") + repick)
        base.query_one(SlotHeatmap).update_layers(
            [(ls.layer, ls.slot_experts, ls.slot_hits_recent, ls.recent_miss_share) for ls in snap.layers])

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
            self.query_one("#hover", Static).update(f"layer {layer} · slot {slot} · expert {expert} · "
                                                    f"{hits} recent hits")

    async def action_quit(self) -> None:
        self._cancel.set()
        self.exit()


def load_keymap() -> dict[str, str]:
    """[keymap] of config.toml: binding id -> keys (e.g. record = "ctrl+g")."""
    from moeslots.tui import config

    try:
        return dict(config.load().get("keymap", {}))
    except config.ConfigError as e:
        raise ValueError(str(e)) from None
