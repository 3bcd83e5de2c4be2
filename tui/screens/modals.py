"""Modal screens: change slots (number or auto) and name a recorded profile."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label


class _Dialog(ModalScreen[str | None]):
    """A centred box; Esc cancels (dismisses with None)."""

    DEFAULT_CSS = """
    _Dialog { align: center middle; }
    _Dialog > Vertical { width: 70; height: auto; border: round $accent; padding: 1 2; background: $surface; }
    """
    BINDINGS = [("escape", "cancel", "Cancel")]

    def action_cancel(self) -> None:
        self.dismiss(None)


class SlotsScreen(_Dialog):

    def __init__(self, current: str, info: str):
        super().__init__()
        self.current, self.info = current, info

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Slots per layer: a number, or 'auto' (the most that fit in free VRAM)")
            yield Label(self.info, id="slots-info")
            yield Input(value=self.current, placeholder="e.g. 64 or auto", id="slots-input")
            yield Button("Apply", variant="primary", id="apply")

    def on_input_submitted(self) -> None:
        self._done()

    def on_button_pressed(self) -> None:
        self._done()

    def _done(self) -> None:
        v = self.query_one(Input).value.strip().lower()
        if v != "auto" and not v.isdigit():
            self.query_one("#slots-info", Label).update(f"[red]'{v}' is neither a number nor 'auto'[/]")
            return
        self.dismiss(v)


class NameScreen(_Dialog):

    def __init__(self, title: str, default: str):
        super().__init__()
        self.title_text, self.default = title, default

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text)
            yield Input(value=self.default, id="name-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)
