"""This chat's sampling (F7): temperature (0 = greedy: the model's most likely token, exactly), top-p, seed. Every
value is checked here (engine.api.Sampling.problem) and an error is one red line in the dialog, nothing saved."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from ...engine.api import Sampling
from .modals import DIALOG_CSS


def parse_sampling(temperature: str, top_p: str, seed: str) -> tuple[Sampling | None, str]:
    """(settings, "") or (None, one line saying what is wrong)."""
    try:
        t = float(temperature.strip() or "0")
    except ValueError:
        return None, f"temperature '{temperature.strip()}': type a number from 0 (greedy) to 5"
    try:
        p = float(top_p.strip() or "1")
    except ValueError:
        return None, f"top-p '{top_p.strip()}': type a number above 0 and at most 1"
    s_text = seed.strip().lower()
    if s_text in ("", "none", "random"):
        sd = None
    elif s_text.isdigit():
        sd = int(s_text)
    else:
        return None, f"seed '{seed.strip()}': type a whole number, or leave it empty for a new draw each reply"
    s = Sampling(t, p, sd)
    problem = s.problem()
    return (None, problem) if problem else (s, "")


class SamplingScreen(ModalScreen[Sampling | None]):
    DEFAULT_CSS = DIALOG_CSS.format(name="SamplingScreen") + """
    SamplingScreen .row { height: auto; }
    SamplingScreen .row Label { width: 14; padding-top: 1; }
    SamplingScreen .row Input { width: 1fr; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def __init__(self, current: Sampling):
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        c = self.current
        with Vertical():
            yield Label("Sampling for this chat. Temperature 0 is greedy: the most likely token, exactly (top-p and "
                        "seed then do not matter).")
            with Horizontal(classes="row"):
                yield Label("temperature")
                yield Input(f"{c.temperature:g}", placeholder="0 = greedy, e.g. 0.7", id="temperature")
            with Horizontal(classes="row"):
                yield Label("top-p")
                yield Input(f"{c.top_p:g}", placeholder="1 = no cut, e.g. 0.9", id="top-p")
            with Horizontal(classes="row"):
                yield Label("seed")
                yield Input("" if c.seed is None else str(c.seed), placeholder="empty: a new draw each reply",
                            id="seed")
            yield Static("", id="error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Greedy", id="greedy")
                yield Button("Cancel", id="cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#save")
    def _save(self) -> None:
        s, err = parse_sampling(*(self.query_one(f"#{i}", Input).value for i in ("temperature", "top-p", "seed")))
        if s is None:
            self.query_one("#error", Static).update(f"not saved: {err}")
            return
        self.dismiss(s)

    @on(Button.Pressed, "#greedy")
    def _greedy(self) -> None:
        self.dismiss(Sampling())

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
