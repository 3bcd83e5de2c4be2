"""The chat list (Ctrl+L): every chat with messages, most recent first; type to search titles and messages; Enter
opens one, F2 renames, Del deletes (after a Yes), Esc closes. Dismisses with the chat to open (None: stay)."""

from __future__ import annotations

import time

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label

from ..store import ChatInfo, Store
from .modals import DIALOG_CSS, ConfirmScreen, NameScreen


def when(t: float, now: float | None = None) -> str:
    now = time.time() if now is None else now
    lt, ln = time.localtime(t), time.localtime(now)
    if lt[:3] == ln[:3]:
        return time.strftime("today %H:%M", lt)
    return time.strftime("%Y-%m-%d %H:%M", lt)


class ChatsScreen(ModalScreen[int | None]):
    DEFAULT_CSS = DIALOG_CSS.format(name="ChatsScreen") + """
    ChatsScreen > Vertical { width: 110; height: 80%; }
    ChatsScreen DataTable { height: 1fr; }
    ChatsScreen #chats-status { color: $text-muted; }
    """
    BINDINGS = [Binding("escape", "close", "Close", id="dialog.cancel"),
                Binding("f2", "rename", "Rename", id="chats.rename"),
                Binding("delete", "delete", "Delete", id="chats.delete"),
                Binding("down", "to_table", show=False)]

    def __init__(self, store: Store, current: int):
        super().__init__()
        self.store, self.current = store, current
        self.shown: list[ChatInfo] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Chats  (type to search · Enter: open · F2: rename · Del: delete · Esc: close)")
            yield Input(placeholder="search titles and messages", id="chats-search")
            yield DataTable(id="chats-table", cursor_type="row", zebra_stripes=True)
            yield Label("", id="chats-status")
            with Horizontal(classes="buttons"):
                yield Button("Open", variant="primary", id="open")
                yield Button("Rename", id="rename")
                yield Button("Delete", variant="error", id="delete")
                yield Button("Close", id="close")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("", "chat", "model", "messages", "last active")
        self.fill()
        here = [i for i, c in enumerate(self.shown) if c.id == self.current]
        if here:                                                  # the cursor starts on the open chat
            self.query_one(DataTable).move_cursor(row=here[0])
        self.query_one(Input).focus()

    def fill(self) -> None:
        query = self.query_one(Input).value
        t = self.query_one(DataTable)
        keep = t.cursor_row
        t.clear()
        self.shown = self.store.chats(query)
        for c in self.shown:
            t.add_row("●" if c.id == self.current else "", c.title or "(untitled)", c.model.removesuffix(".gguf")
                      or "–", str(c.messages), when(c.updated), key=str(c.id))
        if self.shown:
            t.move_cursor(row=min(keep, len(self.shown) - 1))
        n = len(self.shown)
        self.query_one("#chats-status", Label).update(
            f"{n} chat{'s' * (n != 1)}" + (f" with '{query.strip()}'" if query.strip() else "") if n else
            (f"no chat has '{query.strip()}'" if query.strip() else "no chats yet"))

    @on(Input.Changed)
    def _search(self) -> None:
        self.fill()

    @on(Input.Submitted)
    def _open_first(self) -> None:
        self._open()

    def action_to_table(self) -> None:
        self.query_one(DataTable).focus()

    def selected(self) -> ChatInfo | None:
        t = self.query_one(DataTable)
        return self.shown[t.cursor_row] if self.shown and 0 <= t.cursor_row < len(self.shown) else None

    @on(DataTable.RowSelected)
    @on(Button.Pressed, "#open")
    def _open(self) -> None:
        c = self.selected()
        if c is not None:
            self.dismiss(c.id)

    @on(Button.Pressed, "#rename")
    def action_rename(self) -> None:
        c = self.selected()
        if c is None:
            return

        def renamed(title: str | None) -> None:
            if title:
                self.store.rename(c.id, title)
                self.fill()

        self.app.push_screen(NameScreen("Rename this chat:", c.title, what="a name"), renamed)

    @on(Button.Pressed, "#delete")
    def action_delete(self) -> None:
        c = self.selected()
        if c is None:
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.store.delete(c.id)
                self.fill()
                self.notify(f"deleted '{c.title or '(untitled)'}'")

        self.app.push_screen(ConfirmScreen(f"Delete '{c.title or '(untitled)'}' and its {c.messages} messages? "
                                           "This cannot be undone.", yes="Delete", no="Keep"), answered)

    @on(Button.Pressed, "#close")
    def action_close(self) -> None:
        self.dismiss(None)
