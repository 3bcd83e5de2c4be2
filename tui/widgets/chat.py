"""The chat pane's widgets: the prompt box and a chat message (a streaming reply carries a LiveTail)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message as TMessage
from textual.widgets import Label, Markdown, TextArea

from ..stream import LiveTail


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

    def __init__(self, role: str, text: str = "", streaming: bool = False):
        super().__init__(classes=role)
        self.role, self.text, self.streaming = role, text, streaming

    def compose(self) -> ComposeResult:
        yield Label("you ▸" if self.role == "user" else "assistant ▸", classes="who")
        yield Markdown(printable(self.text))
        if self.streaming:
            yield LiveTail()


_CONTROL = {c: "\ufffd" for c in range(32) if c not in (9, 10)} | {127: "\ufffd"}


def printable(text: str) -> str:
    """Model text with terminal control characters (ESC, BEL, CR...) replaced: a reply must never drive the
    terminal (random-weight models emit raw byte tokens; real ones can too)."""
    return text.translate(_CONTROL)
