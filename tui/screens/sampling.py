"""This chat's sampling (F7): temperature (0 = greedy: the model's most likely token, exactly), top-p, top-k, min-p,
the repeat penalty and its window (the last N tokens it looks at), a reply's max tokens, seed (engine.api.Sampling
says what each does). Every value is checked here (engine.api.Sampling.problem) and an error is one red line in the
dialog, which stays open with what was typed; nothing is saved. The chat's system prompt has its own key (F2)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from ...engine.api import Sampling
from .modals import DIALOG_CSS


@dataclasses.dataclass(frozen=True)
class Field:
    name: str            # the Sampling field
    label: str           # shown, and in an error line
    placeholder: str
    hint: str            # what to type, for an error line: "temperature 'hot': type <hint>"

    @property
    def id(self) -> str:
        return self.name.replace("_", "-")


FIELDS = (                # in pairs: one row of the dialog each; placeholders short enough to show whole
    Field("temperature", "temperature", "0 = greedy, e.g. 0.7", "a number from 0 (greedy) to 5"),
    Field("top_p", "top-p", "1 = no cut", "a number above 0 and at most 1"),
    Field("top_k", "top-k", "0 = off, e.g. 40", "a whole number, 0 (off) or more"),
    Field("min_p", "min-p", "0 = off, e.g. 0.05", "a number from 0 (off) to 1"),
    Field("repeat_penalty", "repeat penalty", "1 = off, e.g. 1.1", "a number from 1 (off) to 10, e.g. 1.1"),
    Field("repeat_last_n", "repeat window", "tokens, e.g. 64", "a whole number of tokens, e.g. 64"),
    Field("max_tokens", "max tokens", "empty: default", "a whole number of tokens, or leave it empty for the "
          "default"),
    Field("seed", "seed", "empty: random", "a whole number, or leave it empty for a new draw each reply"),
)
_DEFAULTS = Sampling()


def shown(s: Sampling, f: Field) -> str:
    """A setting as its field shows it: max tokens 0 (the default) and no seed are an empty field."""
    v = getattr(s, f.name)
    if v is None or (f.name == "max_tokens" and v == 0):
        return ""
    return f"{v:g}" if isinstance(v, float) else str(v)


def parse_sampling(texts: Mapping[str, str]) -> tuple[Sampling | None, str]:
    """(settings, "") or (None, one line saying what is wrong); texts: Sampling field name -> what was typed (an
    empty or missing field: its default)."""
    values: dict[str, Any] = {}             # each value as its field types it (float or int)
    for f in FIELDS:
        text = texts.get(f.name, "").strip()
        if text == "" or (f.name == "seed" and text.lower() in ("none", "random")):
            continue                                       # the default (seed: a new draw each reply)
        try:
            values[f.name] = float(text) if isinstance(getattr(_DEFAULTS, f.name), float) else int(text)
        except ValueError:
            return None, f"{f.label} '{text}': type {f.hint}"
    s = dataclasses.replace(_DEFAULTS, **values)
    problem = s.problem()
    return (None, problem) if problem else (s, "")


class SamplingScreen(ModalScreen[Sampling | None]):
    DEFAULT_CSS = DIALOG_CSS.format(name="SamplingScreen") + """
    SamplingScreen > Vertical { overflow-y: auto; }
    SamplingScreen .row { height: auto; margin-top: 1; }
    SamplingScreen .row Label { width: 15; }
    SamplingScreen .row Input { width: 1fr; margin-right: 2; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def __init__(self, current: Sampling):
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Sampling for this chat. Temperature 0 is greedy: the most likely token, exactly (top-p, "
                        "top-k, min-p, seed do not matter; the repeat penalty does). Greedy: all the defaults.")
            for i in range(0, len(FIELDS), 2):
                with Horizontal(classes="row"):
                    for f in FIELDS[i:i + 2]:
                        yield Label(f.label)
                        yield Input(shown(self.current, f), placeholder=f.placeholder, id=f.id, compact=True)
            yield Static("", id="error", classes="error")     # compact fields: the dialog fits 80x24
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Greedy", id="greedy")
                yield Button("Cancel", id="cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#save")
    def _save(self) -> None:
        s, err = parse_sampling({f.name: self.query_one(f"#{f.id}", Input).value for f in FIELDS})
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
