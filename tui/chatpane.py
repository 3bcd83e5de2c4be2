"""The chat pane: the chat log and the prompt box, and the reply being written. It owns the reply's state — its
`state` (a reactive: the prompt box's title and the app's keys follow it), the stop event, the question being
answered and the one waiting for the reply to end, the reply's text buffer and its stream onto the screen — and
the open chat (`chat_id`, its last answer). Sending (Enter while a reply stops is sent once it has), streaming a
reply (tui/stream.py paces it), stopping it (Esc: a reply with nothing in it gives the question back, selected),
regenerate and edit the last question are here; the chat keys that open dialogs or write files are
tui/chatkeys.py. The engine runs on worker threads; the store (tui/store.py) always holds what the log shows.

It talks to the App by messages: a reply ended (ReplyDone, tui/messages.py; the App answers with end_reply), the
chat's subtitle (`subtitle`, which the App watches); the App sets what it owns (`model_name`, `hold` while it
switches models)."""

from __future__ import annotations

import threading
from typing import Any, Callable

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive, var
from textual.timer import Timer
from textual.widgets import Markdown

from ..engine.api import Done, Engine, Message, Sampling, TextDelta
from ..engine.runtime import passing_thread
from .keys import keys_of
from .mdtext import as_markdown, mark_stopped, unmarked
from .messages import ReplyDone
from .store import Store
from .stream import STREAM_EVERY, LiveTail, Pacer, ReplyBuffer, ReplyView
from .widgets.chat import ChatLog, ChatMessage, Notices, Prompt, Welcome

STATES = ("", "answering", "waiting", "stopping")     # idle; a reply runs; ... a question waits for it; it stops


class ChatPane(Vertical):
    # what the reply is doing (STATES); "" is idle. The prompt box's title says it (watch_state); the app's keys
    # read it when pressed (App.check_action: Ctrl+C stops a reply only while one runs). Not bindings=True: no key
    # the footer shows depends on it, and each bindings refresh makes Textual's Footer recompose, whose old keys
    # stay data-bound to it (never freed: the app's memory grew with every reply)
    state: reactive[str] = reactive("", repaint=False, init=False)
    model_name: var[str] = var("", init=False)       # the App's model (the welcome text, new chats, the subtitle)
    subtitle: var[str] = var("", init=False)         # "model · this chat's sampling" (the App's header shows it)

    def __init__(self, engine: Callable[[], Engine], store: Store, chat_id: int, *, model_name: str = "",
                 keymap: dict[str, str] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self._engine = engine                      # the App's engine now (the model picker replaces it)
        self.store, self.chat_id, self.keymap = store, chat_id, dict(keymap or {})
        self.set_reactive(ChatPane.model_name, model_name)
        self.hold = ""                    # the engine is being replaced: a question waits "until <hold>"
        self.inspector_shown = True       # the welcome text says where the inspector is, or how to show it
        self.cancel = threading.Event()   # the running reply's stop (a new one per reply)
        self.reply = ReplyBuffer()        # the generating thread puts text, _pump takes it
        self.last_answer = ""             # the last answer (copy keys), without a stop marker
        self._pending = ""                # the question being answered (Esc before any text gives it back)
        self.queued = ""                  # Enter while a reply runs or stops: sent once it has ended
        self._assistant: ChatMessage | None = None
        self._stream: ReplyView | None = None
        self._pacer = Pacer()
        self._pump_timer: Timer | None = None
        self._told_window: frozenset[int] = frozenset()      # chats told that their oldest turns left the context

    def compose(self) -> ComposeResult:
        yield ChatLog(id="chat-log")
        yield Prompt(id="prompt")

    @property
    def engine(self) -> Engine:
        return self._engine()

    @property
    def generating(self) -> bool:
        """A reply runs (from Enter until it is settled: history, log, prompt box)."""
        return self.state != ""

    @property
    def chat_log(self) -> ChatLog:
        return self.query_one(ChatLog)

    @property
    def prompt(self) -> Prompt:
        return self.query_one(Prompt)

    def watch_state(self, state: str) -> None:
        self.prompt.show_state(state, keys_of("stop", self.keymap))

    def watch_model_name(self) -> None:
        self.show_sampling()

    # -- what the pane shows ------------------------------------------------------------------------------------

    async def show_chat(self, chat_id: int) -> None:
        """The pane shows chat `chat_id` (the welcome text when it has no messages)."""
        self.chat_id = chat_id
        log = self.chat_log
        await log.remove_children()
        msgs = self.store.messages(chat_id)
        await log.mount_all([ChatMessage(r, c) for r, c in msgs] if msgs else [self.welcome()])
        self.last_answer = unmarked(next((c for r, c in reversed(msgs) if r == "assistant"), ""))
        log.follow = True
        log.scroll_end(animate=False)
        self.show_sampling()
        self.say_store_notices()                      # at start: a read-only or moved-aside history

    def say_store_notices(self, then: str = "") -> None:
        """What the history (tui/store.py) has to say, once each: opened read-only, a damaged file moved aside, a
        write that failed (the chat goes on in memory); `then` ends the last line."""
        lines = self.store.take_notices()
        for i, line in enumerate(lines):
            self.notify(line + (then if i == len(lines) - 1 else ""), severity="warning", timeout=12)

    def welcome(self) -> Welcome:
        km = self.keymap
        profile = self.engine.profile
        return Welcome(self.model_name, profile.name if profile else "none yet", "Enter", keys_of("stop", km),
                       keys_of("help", km), keys_of("inspector", km), shown=self.inspector_shown)

    def show_inspector_hint(self, shown: bool) -> None:
        """The inspector was shown or hidden: the welcome text says where it is, or the key that shows it."""
        self.inspector_shown = shown
        for w in self.query(Welcome):
            w.show_inspector(shown)

    async def show_notices(self, lines: list[tuple[str, str]]) -> None:
        """(text, severity) said at start on a small screen: one line each at the end of the log."""
        await self.chat_log.mount(Notices(lines))
        self.call_after_refresh(self.chat_log.stick)

    def show_sampling(self) -> None:
        self.subtitle = " · ".join(x for x in (self.model_name, self.store.sampling(self.chat_id).line()) if x)

    def stick(self) -> None:
        """The log to its bottom if it follows the reply (after a dialog, a resize)."""
        self.chat_log.stick()

    def _messages(self) -> list[Message]:
        msgs = []
        sys_prompt = self.store.system(self.chat_id)
        if sys_prompt:
            msgs.append(Message("system", sys_prompt))
        # (a stopped reply is stored with its marker: the model is given its own text back, without it)
        return msgs + [Message(r, unmarked(c) if r == "assistant" else c) for r, c in self.store.messages(self.chat_id)]

    # -- a reply ----------------------------------------------------------------------------------------------

    @on(Prompt.Send)
    async def _send(self, event: Prompt.Send) -> None:
        """Enter. While a reply runs the question is never refused: it waits (out of the box) and is sent when the
        reply has ended (end_reply), stopped or not. A terminal reads Esc and a key typed within its escape delay
        as one Alt+key, or Esc+Enter as a plain Enter: the stop can be lost, the question must not be. While the
        App opens another model (`hold`) it waits too, and is sent once the model is open."""
        event.stop()
        text = event.text.rstrip()
        if not self.generating and not self.hold:
            await self.ask(text)
            return
        if self.queued:                            # one waits already: this one stays in the box, not dropped
            self.notify("a question already waits for this reply to end: this one stays in the box",
                        severity="warning")
            return
        self.queued, self.prompt.text = text, ""
        if not self.generating:
            self.notify(f"sent once {self.hold}")
        elif self.cancel.is_set():
            self.notify("sent as soon as the reply has stopped")
        else:
            self.state = "waiting"
            self.notify(f"sent when this reply ends ({keys_of('stop', self.keymap)} stops it now)")

    async def ask(self, text: str, from_prompt: bool = True) -> None:
        """The question into the history, then its reply. The prompt box is cleared only once the history holds
        the question: when the file refuses it (a full disk), the history moves to memory, the question stays in
        (or, queued, goes back to) the prompt box and one notice says so; Enter sends it again."""
        prompt = self.prompt
        if not self.store.add(self.chat_id, "user", text, retry=False):
            if not from_prompt:                    # queued: it left the box, which may hold text typed since
                prompt.restore(f"{text}\n\n{prompt.text}" if prompt.text.strip() else text)
            self.say_store_notices(": your question is still in the prompt box, Enter sends it")
            return
        if from_prompt:                            # (a queued question left the box already: what is there now
            prompt.text = ""                       # was typed after it and stays)
        await self.start_reply(text, mount_question=True)

    async def start_reply(self, question: str, mount_question: bool) -> None:
        self._pending = question
        self.cancel = threading.Event()           # before any await: an Esc from now on reaches this reply
        self.state = "answering"
        self.reply.reset()                        # no text, no live tok/s of the last reply (the inspector reads it)
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
        self.call_after_refresh(self._generate, self._messages(), self.cancel,   # after the new messages are drawn
                                self.store.sampling(self.chat_id))

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def _generate(self, messages: list[Message], cancel: threading.Event, sampling: Sampling) -> None:
        # Textual's thread workers are a pool's threads, kept and reused: the reply decodes on a thread of its own
        # that ends with it, so no CPU thread team stays parked beside the next one (engine.runtime.passing_thread)
        try:
            passing_thread.run(lambda: self._reply(messages, cancel, sampling), name="moeslots-reply")
        except Exception as e:  # noqa: BLE001 - no thread for the reply (it posts its own ReplyDone otherwise)
            self.post_message(ReplyDone("", None, f"could not start the reply: {e}"))

    def _reply(self, messages: list[Message], cancel: threading.Event, sampling: Sampling) -> None:
        put = self.reply.put                               # per token: a list append, never a wait on the UI
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
        self.post_message(ReplyDone(text, stats, error))   # handled here, then (bubbling) by the App

    async def _pump(self) -> None:
        """While a reply streams: what came since the last update, onto the screen; then the next one is due
        after STREAM_EVERY or more (tui/stream.py's Pacer keeps the UI thread within its CPU budget)."""
        if self._stream is None:
            return
        text = self.reply.take()
        if text:
            await self._stream.write(as_markdown(text))
            self.chat_log.stick()                            # only while following (the user did not scroll up)
        if self._stream is not None:
            self._pump_timer = self.set_timer(self._pacer.next_delay(), self._pump)

    async def on_reply_done(self, event: ReplyDone) -> None:
        """The reply into the log and the history (or, nothing said, its question back into the prompt box). The
        message goes on to the App, which calls end_reply when it has done its part."""
        if self._pump_timer is not None:
            self._pump_timer.stop()
        stream, self._stream = self._stream, None
        self.reply.take()
        if event.error:
            self.notify(f"no reply: {event.error}", severity="error", timeout=10)
        # a reply stopped by Esc / Ctrl+C (with text) ends in a "— stopped" marker, on screen and in the history
        shown = mark_stopped(event.text) if event.cancelled and event.text.strip() else event.text
        if stream is not None:
            await stream.finish(as_markdown(shown))
        elif self._assistant is not None:
            await self._assistant.query_one(Markdown).update(as_markdown(shown))
        prompt = self.prompt
        if not event.said:
            # nothing said: take the question back out of the chat, into the prompt box
            if self._assistant is not None:
                await self._assistant.remove()
            await self._drop_last_user_message()
            if not prompt.text.strip() and (not self.queued or event.error):      # (failed: back even with
                prompt.restore(self._pending)                                      # another question waiting)
        else:
            self.store.add(self.chat_id, "assistant", shown)
            self.last_answer = event.text
            if event.cancelled and not prompt.text.strip() and not self.queued:
                prompt.restore(self._pending)              # Esc puts the question back too, to edit and resend
        st = event.stats
        if st is not None and st.dropped and self.chat_id not in self._told_window:     # once per chat
            self._told_window = self._told_window | {self.chat_id}
            self.notify(f"the oldest turns no longer fit the model's context ({st.n_ctx} tokens): they stay in the "
                        "history but the model no longer sees them", timeout=12)

    async def end_reply(self) -> None:
        """The App has done its part of the ended reply: the pane is idle again, and a waiting question is sent."""
        self.say_store_notices()                  # the reply's write failed: it is kept in memory
        self._assistant = None
        self.state = ""                           # the reply is settled (store, log, prompt)
        self.chat_log.stick()
        self.prompt.focus()
        await self.send_queued()

    async def send_queued(self) -> None:
        """The question that waited, if any, now that neither a reply nor a model switch holds it."""
        if self.queued and not self.generating and not self.hold:
            text, self.queued = self.queued, ""
            await self.ask(text, from_prompt=False)

    async def _drop_last_user_message(self) -> None:
        self.store.drop_last_user_message(self.chat_id)
        users = [m for m in self.chat_log.query(ChatMessage) if m.role == "user"]
        if users:
            await users[-1].remove()
        if not self.chat_log.query(ChatMessage):
            await self.chat_log.mount(self.welcome())

    def stop(self) -> None:
        """Esc / Ctrl+C: the running reply stops at its next token."""
        if self.generating:
            self.cancel.set()
            self.state = "stopping"

    # -- regenerate, edit the last question --------------------------------------------------------------------

    async def regenerate(self) -> None:
        if self.store.drop_last_reply(self.chat_id) is None:
            self.notify("nothing to regenerate: no answer yet")
            return
        shown = list(self.chat_log.query(ChatMessage))
        if shown and shown[-1].role == "assistant":
            await shown[-1].remove()
        question = next((c for r, c in reversed(self.store.messages(self.chat_id)) if r == "user"), "")
        self.say_store_notices()
        await self.start_reply(question, mount_question=False)

    async def edit_last(self) -> None:
        prompt = self.prompt
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
        self.last_answer = unmarked(next((c for r, c in reversed(self.store.messages(self.chat_id))
                                          if r == "assistant"), ""))
        prompt.restore(text)
        self.say_store_notices()

    # -- another chat -----------------------------------------------------------------------------------------

    async def model_switched(self, model_name: str, own_chat: bool) -> None:
        """The App opened another model (tui/modelswitch.py): a waiting question is no longer held (the App sends
        it when it has done its part: send_queued). A chat belongs to its model (`own_chat`: the switch succeeded):
        the model switched to continues its own last chat, or starts one; else the open chat goes on."""
        self.hold, self.model_name = "", model_name
        if not own_chat:
            return
        mine = self.store.last_chat(model_name)
        chat = mine or self.store.new_chat(self.store.system(self.chat_id), model=model_name)
        self.notify(f"switched to {model_name}: " + ("its last chat" if mine else "a new chat for it")
                    + f" ({keys_of('chats', self.keymap)} lists every chat)", timeout=8)
        if chat != self.chat_id:
            await self.show_chat(chat)

    async def open_chat(self, chat_id: int) -> None:
        """Chat `chat_id` in the pane, and a fresh conversation in the engine (on a worker thread)."""
        await self.show_chat(chat_id)
        self._engine_new_chat()

    @work(thread=True, group="engine")
    def _engine_new_chat(self) -> None:
        self.engine.new_chat()
