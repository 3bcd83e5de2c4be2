"""Dialogs: change the slots (a number or auto), name something (a profile, a chat, the system prompt), confirm
(Yes/No buttons: y, n, Esc). Text wraps to the dialog's width; every error is one red line inside the dialog, and
the dialog stays open so the value can be fixed."""

from __future__ import annotations

from typing import Callable

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{ width: 76; max-width: 96%; height: auto; max-height: 90%; border: round $accent;
    padding: 1 2; background: $surface; }}
{name} Label, {name} Static {{ width: 100%; }}
{name} .error {{ color: $error; }}
{name} .hint {{ color: $text-muted; }}
{name} .buttons {{ height: auto; margin-top: 1; align-horizontal: right; }}
{name} .buttons Button {{ margin-left: 2; min-width: 10; }}
"""


class _Dialog(ModalScreen[str | None]):
    """A centred box; Esc cancels (dismisses with None)."""

    DEFAULT_CSS = DIALOG_CSS.format(name="_Dialog")
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def action_cancel(self) -> None:
        self.dismiss(None)

    def error(self, text: str) -> None:
        self.query_one("#error", Static).update(text)


def parse_slots(text: str, n_expert: int) -> tuple[str | None, str]:
    """(value, "") for "auto" or a whole number 0..n_expert (n_expert 0: unknown), else (None, the reason)."""
    v = text.strip().lower()
    if v == "auto":
        return "auto", ""
    most = f"0 to {n_expert}" if n_expert else "0 or more"
    try:
        n = int(v)
    except ValueError:
        return None, f"'{text.strip()}' is not a slot count: type a whole number ({most}) or auto"
    if n < 0:
        return None, f"{n}: a slot count is not negative; type {most} (0: no slots), or auto"
    if n_expert and n > n_expert:
        return None, f"{n} slots per layer: the model has {n_expert} experts per layer; type {most}, or auto"
    return str(n), ""


class SlotsScreen(_Dialog):
    """Applies the value itself (on a worker thread: uploading a pack takes a moment) and closes only when the
    engine took it, with the new load line; an error stays in the dialog, the slots unchanged."""

    DEFAULT_CSS = DIALOG_CSS.format(name="SlotsScreen")

    def __init__(self, current: str, info: str, n_expert: int, apply: Callable[[str], str],
                 refuse: Callable[[str], str | None] = lambda v: None):
        super().__init__()
        self.current, self.info, self.n_expert = current, info, n_expert
        self.apply, self.refuse = apply, refuse
        self.applying = False

    def compose(self) -> ComposeResult:
        most = f"0 to {self.n_expert}" if self.n_expert else "a number"
        with Vertical():
            yield Label(f"Slots per layer: {most}, or auto (the most that fit in free VRAM). The chat is kept.")
            yield Label(self.info, id="slots-info", classes="hint")
            yield Input(value=self.current, placeholder="e.g. 64 or auto", id="slots-input")
            yield Static("", id="error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("Apply", variant="primary", id="apply")
                yield Button("Cancel", id="cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#apply")
    def _done(self) -> None:
        if self.applying:
            return
        value, err = parse_slots(self.query_one(Input).value, self.n_expert)
        err = err or (self.refuse(value) if value is not None else None) or ""
        if value is None or err:
            self.error(f"slots unchanged: {err}")
            return
        self.applying = True
        self.query_one(Input).disabled = True
        self.error("")
        self.query_one("#slots-info", Label).update(f"applying {value}…")
        self._apply(value)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        if not self.applying:                    # a change under way cannot be taken back half-way
            self.dismiss(None)

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _apply(self, value: str) -> None:
        try:
            line = self.apply(value)
        except Exception as e:  # noqa: BLE001 - shown in the dialog; the engine kept its plan
            self.app.call_from_thread(self._failed, str(e))
            return
        self.app.call_from_thread(self.dismiss, line)

    def _failed(self, msg: str) -> None:
        self.applying = False
        self.query_one(Input).disabled = False
        self.query_one("#slots-info", Label).update(self.info)
        self.error(f"slots unchanged: {msg}")
        self.query_one(Input).focus()


class NameScreen(_Dialog):
    """A line of text (Enter or OK); empty text is refused unless `allow_empty`."""

    DEFAULT_CSS = DIALOG_CSS.format(name="NameScreen")

    def __init__(self, title: str, default: str, allow_empty: bool = False, what: str = "a name"):
        super().__init__()
        self.title_text, self.default, self.allow_empty, self.what = title, default, allow_empty, what

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text)
            yield Input(value=self.default, id="name-input")
            yield Static("", id="error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("OK", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#ok")
    def _done(self) -> None:
        text = self.query_one(Input).value.strip()
        if not text and not self.allow_empty:
            self.error(f"type {self.what} (Esc: cancel)")
            return
        self.dismiss(text)

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A question with Yes and No buttons: y / n, Enter on the focused button (Yes first), Esc: No."""

    DEFAULT_CSS = DIALOG_CSS.format(name="ConfirmScreen")
    BINDINGS = [Binding("y", "answer(True)", "Yes", id="confirm.yes"),
                Binding("n", "answer(False)", "No", id="confirm.no"),
                Binding("escape", "answer(False)", "No", id="dialog.cancel"),
                Binding("left,right", "app.focus_next", show=False)]

    def __init__(self, question: str, yes: str = "Yes", no: str = "No"):
        super().__init__()
        self.question, self.yes, self.no = question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question, id="question")
            with Horizontal(classes="buttons"):
                yield Button(self.yes, variant="primary", id="yes")
                yield Button(self.no, id="no")

    def on_mount(self) -> None:
        self.query_one("#yes").focus()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")
