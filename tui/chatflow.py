"""The chat itself, a mixin of MoeslotsApp (tui/app.py): sending (Enter while a reply stops is sent once it has),
streaming a reply (tui/stream.py paces it), stopping it (Esc: a reply with nothing in it gives the question back,
selected), regenerate, edit the last question, new chat, the chat list, per-chat system prompt and sampling, copy
and export. The engine runs on worker threads; the store (tui/store.py) always holds what the chat pane shows."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from textual import work
from textual.message import Message as TMessage
from textual.widgets import Markdown

from ..engine.api import Done, Message, Sampling, TextDelta
from .keys import keys_of
from .mdtext import as_markdown, code_blocks, export_header, export_markdown, mark_stopped, unmarked
from .screens.chats import ChatsScreen
from .screens.modals import NameScreen
from .screens.sampling import SamplingScreen
from .store import data_dir
from .stream import STREAM_EVERY, LiveTail, ReplyView
from .widgets.chat import ChatLog, ChatMessage, Prompt, Welcome

if TYPE_CHECKING:
    from textual.app import App
    from textual.timer import Timer

    from ..engine.api import Engine, TurnStats
    from .store import Store
    from .stream import Pacer, ReplyBuffer

    _Base = App[None]
else:
    _Base = object


class ReplyDone(TMessage):
    def __init__(self, text: str, stats: Any, error: str | None = None) -> None:
        super().__init__()
        self.text, self.stats, self.error = text, stats, error


class ChatFlow(_Base):
    engine: "Engine"
    store: "Store"
    chat_id: int
    model_name: str
    measured_at: int | None
    last_turn: "TurnStats | None"
    _keymap: dict[str, str]
    _generating: bool
    _cancel: threading.Event
    _pending_prompt: str
    _queued: str
    _assistant: ChatMessage | None
    _stream: ReplyView | None
    _reply: "ReplyBuffer"
    _pacer: "Pacer"
    _pump_timer: "Timer | None"
    _last_answer: str
    _inspector_visible: bool
    _told_window: frozenset[int] = frozenset()      # chats told that their oldest turns left the model's context

    if TYPE_CHECKING:                                   # the app's and EngineActions' (tui/actions.py)
        def slots_now(self) -> int: ...
        def _say_new_notices(self) -> None: ...
        def _say_auto_switch(self) -> None: ...

    # -- what the chat pane shows -------------------------------------------------------------------------------

    @property
    def chat_log(self) -> ChatLog:
        return self.screen_stack[0].query_one(ChatLog)

    async def show_chat(self, chat_id: int) -> None:
        """The chat pane shows chat `chat_id` (the welcome text when it has no messages)."""
        self.chat_id = chat_id
        log = self.chat_log
        await log.remove_children()
        msgs = self.store.messages(chat_id)
        await log.mount_all([ChatMessage(r, c) for r, c in msgs] if msgs else [self.welcome()])
        self._last_answer = unmarked(next((c for r, c in reversed(msgs) if r == "assistant"), ""))
        log.follow = True
        log.scroll_end(animate=False)
        self.show_sampling()
        self._say_store_notices()                     # at start: a read-only or moved-aside history

    def _say_store_notices(self, then: str = "") -> None:
        """What the history (tui/store.py) has to say, once each: opened read-only, a damaged file moved aside, a
        write that failed (the chat goes on in memory); `then` ends the last line."""
        lines = self.store.take_notices()
        for i, line in enumerate(lines):
            self.notify(line + (then if i == len(lines) - 1 else ""), severity="warning", timeout=12)

    def welcome(self) -> Welcome:
        km = self._keymap
        profile = self.engine.profile
        return Welcome(self.model_name, profile.name if profile else "none yet", "Enter", keys_of("stop", km),
                       keys_of("help", km), keys_of("inspector", km), shown=self._inspector_visible)

    def show_sampling(self) -> None:
        self.sub_title = " · ".join(x for x in (self.model_name, self.store.sampling(self.chat_id).line()) if x)

    def _messages(self) -> list[Message]:
        msgs = []
        sys_prompt = self.store.system(self.chat_id)
        if sys_prompt:
            msgs.append(Message("system", sys_prompt))
        # (a stopped reply is stored with its marker: the model is given its own text back, without it)
        return msgs + [Message(r, unmarked(c) if r == "assistant" else c) for r, c in self.store.messages(self.chat_id)]

    def _busy(self) -> bool:
        if self._generating:
            self.notify(f"stop the reply first ({keys_of('stop', self._keymap)})", severity="warning")
        return self._generating

    # -- a reply ----------------------------------------------------------------------------------------------

    async def on_prompt_send(self, event: Prompt.Send) -> None:     # (a mixin: handlers by name, not @on)
        """Enter. While a reply runs the question is never refused: it waits (out of the box) and is sent when the
        reply has ended (on_reply_done), stopped or not. A terminal reads Esc and a key typed within its escape
        delay as one Alt+key, or Esc+Enter as a plain Enter: the stop can be lost, the question must not be."""
        text = event.text.rstrip()
        if self._generating:
            prompt = self.query_one(Prompt)
            if self._queued:                       # one waits already: this one stays in the box, not dropped
                self.notify("a question already waits for this reply to end: this one stays in the box",
                            severity="warning")
            elif self._cancel.is_set():
                self._queued, prompt.text = text, ""
                self.notify("sent as soon as the reply has stopped")
            else:
                self._queued, prompt.text = text, ""
                stop = keys_of("stop", self._keymap)
                prompt.border_title = f"answering… {stop}: stop · your question waits: sent when this reply ends"
                self.notify(f"sent when this reply ends ({stop} stops it now)")
            return
        await self._ask(text)

    async def _ask(self, text: str, from_prompt: bool = True) -> None:
        """The question into the history, then its reply. The prompt box is cleared only once the history holds
        the question: when the file refuses it (a full disk), the history moves to memory, the question stays in
        (or, queued, goes back to) the prompt box and one notice says so; Enter sends it again."""
        prompt = self.query_one(Prompt)
        if not self.store.add(self.chat_id, "user", text, retry=False):
            if not from_prompt:                    # queued: it left the box, which may hold text typed since
                prompt.restore(f"{text}\n\n{prompt.text}" if prompt.text.strip() else text)
            self._say_store_notices(": your question is still in the prompt box, Enter sends it")
            return
        if from_prompt:                            # (a queued question left the box already: what is there now
            prompt.text = ""                       # was typed after it and stays)
        await self._start_reply(text, mount_question=True)

    async def _start_reply(self, question: str, mount_question: bool) -> None:
        self._pending_prompt = question
        self._cancel = threading.Event()          # before any await: an Esc from now on reaches this reply
        self._generating = True
        self._reply.reset()                       # no text, no live tok/s of the last reply (the inspector reads it)
        self.query_one(Prompt).show_state("answering", keys_of("stop", self._keymap))
        log = self.chat_log
        for w in log.query(Welcome):
            await w.remove()
        if mount_question:
            await log.mount(ChatMessage("user", question))
        self._assistant = ChatMessage("assistant", "", streaming=True)
        await log.mount(self._assistant)
        self._stream = ReplyView(self._assistant.query_one(Markdown), self._assistant.query_one(LiveTail))
        log.follow = True
        log.scroll_end(animate=False)
        self._pacer.start()
        self._pump_timer = self.set_timer(STREAM_EVERY, self._pump)
        self.call_after_refresh(self.generate, self._messages(), self._cancel,   # after the new messages are drawn
                                self.store.sampling(self.chat_id))

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def generate(self, messages: list[Message], cancel: threading.Event, sampling: Sampling) -> None:
        put = self._reply.put                              # per token: a list append, never a wait on the UI
        text, stats, error = "", None, None
        # the chat's max tokens (0: the engine's own limit), passed only when set (engine.engine.Engine.chat takes it)
        limit = {"max_tokens": sampling.max_tokens} if sampling.max_tokens else {}
        try:
            for ev in self.engine.chat(messages, cancel=cancel, sampling=sampling, **limit):
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
            await self._stream.write(as_markdown(text))
            self.chat_log.stick()                            # only while following (the user did not scroll up)
        if self._stream is not None:
            self._pump_timer = self.set_timer(self._pacer.next_delay(), self._pump)

    async def on_reply_done(self, event: ReplyDone) -> None:
        if self._pump_timer is not None:
            self._pump_timer.stop()
        stream, self._stream = self._stream, None
        self._reply.take()
        cancelled = bool(event.stats and event.stats.cancelled)
        self.last_turn = event.stats
        if event.error:
            self.notify(f"no reply: {event.error}", severity="error", timeout=10)
        # a reply stopped by Esc / Ctrl+C (with text) ends in a "— stopped" marker, on screen and in the history
        shown = mark_stopped(event.text) if cancelled and event.text.strip() else event.text
        if stream is not None:
            await stream.finish(as_markdown(shown))
        elif self._assistant is not None:
            await self._assistant.query_one(Markdown).update(as_markdown(shown))
        prompt = self.query_one(Prompt)
        if (cancelled or event.error) and not event.text.strip():
            # nothing said: take the question back out of the chat, into the prompt box
            if self._assistant is not None:
                await self._assistant.remove()
            await self._drop_last_user_message()
            if not prompt.text.strip() and (not self._queued or event.error):     # (failed: back even with
                prompt.restore(self._pending_prompt)                               # another question waiting)
        else:
            self.store.add(self.chat_id, "assistant", shown)
            self._last_answer = event.text
            if event.stats is not None and event.stats.tokens:
                self.measured_at = self.slots_now()
            if cancelled and not prompt.text.strip() and not self._queued:
                prompt.restore(self._pending_prompt)       # Esc puts the question back too, to edit and resend
        st = event.stats
        if st is not None and st.dropped and self.chat_id not in self._told_window:     # once per chat
            self._told_window = self._told_window | {self.chat_id}
            self.notify(f"the oldest turns no longer fit the model's context ({st.n_ctx} tokens): they stay in the "
                        "history but the model no longer sees them", timeout=12)
        self._say_new_notices()
        self._say_auto_switch()
        self._say_store_notices()                 # the reply's write failed: it is kept in memory
        self._assistant = None
        self._generating = False                  # the reply is settled (store, log, prompt)
        prompt.show_state("")
        self.chat_log.stick()
        prompt.focus()
        if self._queued:
            text, self._queued = self._queued, ""
            await self._ask(text, from_prompt=False)

    async def _drop_last_user_message(self) -> None:
        self.store.drop_last_user_message(self.chat_id)
        users = [m for m in self.chat_log.query(ChatMessage) if m.role == "user"]
        if users:
            await users[-1].remove()
        if not self.chat_log.query(ChatMessage):
            await self.chat_log.mount(self.welcome())

    def action_stop(self) -> None:
        if self._generating:
            self._cancel.set()
            self.query_one(Prompt).show_state("stopping")

    # -- regenerate, edit the last question --------------------------------------------------------------------

    async def action_regenerate(self) -> None:
        if self._busy():
            return
        if self.store.drop_last_reply(self.chat_id) is None:
            self.notify("nothing to regenerate: no answer yet")
            return
        shown = list(self.chat_log.query(ChatMessage))
        if shown and shown[-1].role == "assistant":
            await shown[-1].remove()
        question = next((c for r, c in reversed(self.store.messages(self.chat_id)) if r == "user"), "")
        self._say_store_notices()
        await self._start_reply(question, mount_question=False)

    async def action_edit_last(self) -> None:
        if self._busy():
            return
        prompt = self.query_one(Prompt)
        if prompt.text.strip():
            self.notify("the prompt box has text: send or clear it first (edit-last puts your last question there)",
                        severity="warning")
            return
        text = self.store.take_last_question(self.chat_id)
        if text is None:
            self.notify("no question to edit yet")
            return
        shown = list(self.chat_log.query(ChatMessage))
        last_user = max((i for i, m in enumerate(shown) if m.role == "user"), default=len(shown))
        for m in shown[last_user:]:
            await m.remove()
        if not self.chat_log.query(ChatMessage):
            await self.chat_log.mount(self.welcome())
        self._last_answer = unmarked(next((c for r, c in reversed(self.store.messages(self.chat_id))
                                           if r == "assistant"), ""))
        prompt.restore(text)
        self._say_store_notices()

    # -- chats ------------------------------------------------------------------------------------------------

    async def action_new_chat(self) -> None:
        if self._busy():
            return
        await self.show_chat(self.store.new_chat(self.store.system(self.chat_id), self.store.sampling(self.chat_id),
                                                 model=self.model_name))
        self.new_chat_engine()
        self.notify("new chat")

    @work(thread=True, group="engine")
    def new_chat_engine(self) -> None:
        self.engine.new_chat()

    @work(exclusive=True, group="modal")
    async def action_chats(self) -> None:
        if self._busy():
            return
        chosen = await self.push_screen_wait(ChatsScreen(self.store, self.chat_id))
        if chosen is not None and chosen != self.chat_id:
            await self.show_chat(chosen)
            self.new_chat_engine()
            info = self.store.info(chosen)
            made = (f" (made with {info.model}; {self.model_name} answers from here)"
                    if info and info.model and info.model != self.model_name else "")
            self.notify(f"opened '{info.title if info and info.title else '(untitled)'}'{made}")
        elif not self.store.exists(self.chat_id):                # the open chat was deleted
            await self.show_chat(self.store.new_chat(self.store.system(self.chat_id), model=self.model_name))
            self.new_chat_engine()
        self._say_store_notices()                                # a rename or delete the file refused

    @work(exclusive=True, group="modal")
    async def action_system_prompt(self) -> None:
        text = await self.push_screen_wait(NameScreen("System prompt for this chat (empty: none):",
                                                      self.store.system(self.chat_id), allow_empty=True))
        if text is not None:
            self.store.set_system(self.chat_id, text)
            self.notify("system prompt set" if text else "system prompt cleared")
            self._say_store_notices()

    @work(exclusive=True, group="modal")
    async def action_sampling(self) -> None:
        s = await self.push_screen_wait(SamplingScreen(self.store.sampling(self.chat_id)))
        if s is not None:
            self.store.set_sampling(self.chat_id, s)
            self.show_sampling()
            self._say_store_notices()
            self.notify(f"sampling for this chat: {s.line()}")

    # -- copy, export -----------------------------------------------------------------------------------------

    def action_copy_last(self) -> None:
        if not self._last_answer:
            self.notify("no answer to copy yet")
            return
        self.copy_to_clipboard(self._last_answer)
        self.notify("last answer copied")

    def action_copy_code(self) -> None:
        blocks = code_blocks(self._last_answer)
        if not blocks:
            self.notify("the last answer has no code block")
            return
        self.copy_to_clipboard(blocks[-1])
        n = blocks[-1].count("\n") + 1
        self.notify(f"code block copied ({n} line{'s' * (n != 1)}; click a code block to copy another)")

    def action_export(self) -> None:
        """The chat as Markdown under <data>/exports/: a header (title, model, date, sampling, system prompt), then
        each message under its role (a stopped reply with its marker)."""
        out = data_dir() / "exports" / f"chat-{self.chat_id}.md"
        chat = self.chat_id
        info = self.store.info(chat)
        made_with, now = (info.model if info else ""), self.model_name       # made with one, answered by another
        model = f"{made_with}, then {now}" if made_with and now and made_with != now else made_with or now
        header = export_header(info.title if info else "", model, self.store.sampling(chat).line(),
                               self.store.system(chat), info.created if info else None)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(export_markdown(header, self.store.messages(chat)), encoding="utf-8")
        except OSError as e:
            self.notify(f"could not export the chat: {e}", severity="error", timeout=10)
            return
        self.notify(f"exported to {out}")

