"""The chat pane's widgets: the prompt box, the chat log (follows a streaming reply), a chat message (a streaming
reply carries a LiveTail; a click on a code block copies it; code lines wrap at the pane's width, never cut off),
the welcome text of an empty chat and the start-up notices of a small screen."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message as TMessage
from textual.widgets import Label, Markdown, Static, TextArea
from textual.widgets._markdown import MarkdownFence
from textual.widgets.text_area import Selection

from ..mdtext import as_markdown, parser, printable
from ..stream import LiveTail

__all__ = ["ChatLog", "ChatMessage", "Notices", "Prompt", "Welcome", "printable"]


class Prompt(TextArea):
    """Enter sends; Shift+Enter and Ctrl+J insert a newline; Esc stops generation (handled by the app)."""

    class Send(TMessage):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    BINDINGS = [Binding("ctrl+j", "newline", "Newline", show=False, id="prompt.newline")]

    def show_state(self, state: str, stop_key: str = "Esc") -> None:
        """The box's title says what Enter does now: '' (idle: it sends), 'answering' (the question waits and is
        sent when the reply ends), 'waiting' (one does) or 'stopping' (it sends once the reply has stopped)."""
        self.border_title = {"answering": f"answering… {stop_key}: stop",
                             "waiting": f"answering… {stop_key}: stop · your question waits: sent when this reply "
                                        "ends",
                             "stopping": "stopping… Enter: send when stopped"}.get(state, "")

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

    def restore(self, text: str) -> None:
        """A question put back (Esc before the reply said anything, edit-last): all of it selected, the cursor at
        its end, so typing replaces it and an arrow key keeps it to edit (never a new question typed in front of
        the old one and sent as one)."""
        self.text = text
        self.selection = Selection((0, 0), self.document.end)
        self.focus()


class ChatLog(VerticalScroll):
    """The messages. `follow`: stay at the bottom as a reply grows; off when the user scrolls up, on again when
    they scroll back to the bottom. Only a scroll up the user makes turns it off: content growing while a dialog
    is open, or a re-wrap after the inspector is toggled, does not."""

    follow = True

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if new >= self.max_scroll_y - 1:
            self.follow = True
        elif new < old and not self._clamped(old):
            self.follow = False

    def _clamped(self, old: float) -> bool:
        """The view moved up because it got shorter (a re-wrap), not because the user scrolled."""
        return old > self.max_scroll_y

    def stick(self) -> None:
        """To the bottom, if following (after a write, a dialog, a resize)."""
        if self.follow:
            self.scroll_end(animate=False)


class ChatMessage(Vertical):
    DEFAULT_CSS = """
    ChatMessage { height: auto; margin: 0 0 1 0; }
    ChatMessage > .who { color: $text-muted; text-style: bold; }
    ChatMessage.user > .who { color: $accent; }
    ChatMessage > Markdown { margin: 0; padding: 0; }
    ChatMessage MarkdownFence { margin: 0 0 1 0; overflow-x: hidden; }
    ChatMessage MarkdownFence > Label { width: 1fr; }   /* code lines wrap (Textual's fence: cut at the width,
                                                           scrolled sideways with no scroll bar to show it) */
    """

    def __init__(self, role: str, text: str = "", streaming: bool = False):
        super().__init__(classes=role)
        self.role, self.text, self.streaming = role, text, streaming

    def compose(self) -> ComposeResult:
        yield Label("you ▸" if self.role == "user" else "assistant ▸", classes="who")
        yield Markdown(as_markdown(self.text), parser_factory=parser)
        if self.streaming:
            yield LiveTail()

    def on_click(self, event: events.Click) -> None:
        node: Any = event.widget
        while node is not None and node is not self:
            if isinstance(node, MarkdownFence):
                self.app.copy_to_clipboard(node.code)
                n = node.code.count("\n") + 1
                self.app.notify(f"code block copied ({n} line{'s' * (n != 1)})")
                event.stop()
                return
            node = node.parent


class Welcome(Static):
    """What an empty chat shows: what the app is and the keys that matter. Where the inspector is hidden (a narrow
    terminal, or the toggle key) it says so and names the key that shows it (the app calls show_inspector)."""

    DEFAULT_CSS = """
    Welcome { margin: 1 2; padding: 1 2; border: round $accent 50%; height: auto; color: $text; }
    """

    def __init__(self, model: str, profile: str, send: str, stop: str, help: str, inspector: str = "Ctrl+T",
                 shown: bool = True) -> None:
        self._keys = (send, stop, help, inspector)
        self._model, self._profile = model, profile
        super().__init__(self._text(shown), id="welcome")

    def show_inspector(self, shown: bool) -> None:
        self.update(self._text(shown))

    def _text(self, shown: bool) -> str:
        send, stop, help, insp = self._keys
        where = (f"the inspector (right; [b]{insp}[/b] hides it) shows it live" if shown else
                 f"the inspector (hidden now: [b]{insp}[/b] shows it) shows it live")
        return (f"[b]moeslots[/b] — a chat with [b]{_esc(self._model) or 'a local MoE model'}[/b], a "
                "Mixture-of-Experts model. Each layer's most used experts sit in fast [b]slots[/b] (GPU memory; host "
                f"memory on a machine without a GPU), the rest are computed on the CPU; {where}: which experts are in "
                f"slots, how often they hit, tokens/s.  Profile: {_esc(self._profile)}.\n\n"
                f"  [b]{send}[/b]  send your question\n"
                f"  [b]{stop}[/b]  stop the answer\n"
                f"  [b]{insp}[/b]  show/hide the inspector\n"
                f"  [b]{help}[/b]  every key (chats, regenerate, sampling, slots…)")


class Notices(Static):
    """What the app had to say at start on a small screen, in the chat pane instead of toasts over it (at 80x24
    five toasts covered half the screen): one line each, cut with … at the pane's width; a click shows them whole
    (and again: one line each)."""

    DEFAULT_CSS = """
    Notices { margin: 0 2 1 2; height: auto; color: $text-muted; text-wrap: nowrap; text-overflow: ellipsis; }
    Notices.-whole { text-wrap: wrap; }
    """

    def __init__(self, lines: list[tuple[str, str]]) -> None:
        """lines: (text, severity) as App.notify was given them; warnings and errors are marked ⚠."""
        self.lines = [text for text, _ in lines]
        content = Content("\n").join(
            Content.assemble(("⚠ ", "$text-warning") if sev in ("warning", "error") else "· ", printable(text))
            for text, sev in lines)
        super().__init__(content, id="notices")
        self.tooltip = "start-up notices: click to show them whole (or one line each)"

    def on_click(self) -> None:
        self.toggle_class("-whole")
        self.refresh(layout=True)                   # (the wrap style alone does not re-measure the height)


def _esc(text: str) -> str:
    return text.replace("[", r"\[")
