"""The chat keys that open a dialog or leave the app: a new chat, the chat list, this chat's system prompt and
sampling, copy the last answer or its last code block, export the chat. A plain object the App owns, over the chat
pane (tui/chatpane.py: the open chat, the store); the App calls it when no reply runs where that matters, and runs
the dialog ones as its workers (they wait for the dialog)."""

from __future__ import annotations

from .chatpane import ChatPane
from .mdtext import code_blocks, export_header, export_markdown
from .screens.chats import ChatsScreen
from .screens.modals import NameScreen
from .screens.sampling import SamplingScreen
from .store import data_dir


class ChatKeys:
    def __init__(self, pane: ChatPane) -> None:
        self.pane = pane

    async def new_chat(self) -> None:
        pane, store = self.pane, self.pane.store
        await pane.open_chat(store.new_chat(store.system(pane.chat_id), store.sampling(pane.chat_id),
                                            model=pane.model_name))
        pane.notify("new chat")

    async def chats(self) -> None:
        """The chat list (in a worker: it waits for the dialog)."""
        pane, store = self.pane, self.pane.store
        chosen = await pane.app.push_screen_wait(ChatsScreen(store, pane.chat_id))
        if chosen is not None and chosen != pane.chat_id:
            await pane.open_chat(chosen)
            info = store.info(chosen)
            made = (f" (made with {info.model}; {pane.model_name} answers from here)"
                    if info and info.model and info.model != pane.model_name else "")
            pane.notify(f"opened '{info.title if info and info.title else '(untitled)'}'{made}")
        elif not store.exists(pane.chat_id):                     # the open chat was deleted
            await pane.open_chat(store.new_chat(store.system(pane.chat_id), model=pane.model_name))
        pane.say_store_notices()                                 # a rename or delete the file refused

    async def system_prompt(self) -> None:
        pane, store = self.pane, self.pane.store
        text = await pane.app.push_screen_wait(NameScreen("System prompt for this chat (empty: none):",
                                                          store.system(pane.chat_id), allow_empty=True))
        if text is not None:
            store.set_system(pane.chat_id, text)
            pane.notify("system prompt set" if text else "system prompt cleared")
            pane.say_store_notices()

    async def sampling(self) -> None:
        pane, store = self.pane, self.pane.store
        s = await pane.app.push_screen_wait(SamplingScreen(store.sampling(pane.chat_id)))
        if s is not None:
            store.set_sampling(pane.chat_id, s)
            pane.show_sampling()
            pane.say_store_notices()
            pane.notify(f"sampling for this chat: {s.line()}")

    def copy_last(self) -> None:
        answer = self.pane.last_answer
        if not answer:
            self.pane.notify("no answer to copy yet")
            return
        self.pane.app.copy_to_clipboard(answer)
        self.pane.notify("last answer copied")

    def copy_code(self) -> None:
        blocks = code_blocks(self.pane.last_answer)
        if not blocks:
            self.pane.notify("the last answer has no code block")
            return
        self.pane.app.copy_to_clipboard(blocks[-1])
        n = blocks[-1].count("\n") + 1
        self.pane.notify(f"code block copied ({n} line{'s' * (n != 1)}; click a code block to copy another)")

    def export(self) -> None:
        """The chat as Markdown under <data>/exports/: a header (title, model, date, sampling, system prompt), then
        each message under its role (a stopped reply with its marker)."""
        pane, store = self.pane, self.pane.store
        chat = pane.chat_id
        out = data_dir() / "exports" / f"chat-{chat}.md"
        info = store.info(chat)
        made_with, now = (info.model if info else ""), pane.model_name       # made with one, answered by another
        model = f"{made_with}, then {now}" if made_with and now and made_with != now else made_with or now
        header = export_header(info.title if info else "", model, store.sampling(chat).line(),
                               store.system(chat), info.created if info else None)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(export_markdown(header, store.messages(chat)), encoding="utf-8")
        except OSError as e:
            pane.notify(f"could not export the chat: {e}", severity="error", timeout=10)
            return
        pane.notify(f"exported to {out}")
