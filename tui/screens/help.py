"""The app's keys (F1): what each does, with the keys bound now ([keymap] in config.toml rebinds them). F1 again
(the app's `help` binding, wherever the keymap put it) or Esc closes it."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from ..keys import help_rows, keys_of


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 100; max-width: 96%; height: auto; max-height: 94%; border: round $accent;
        padding: 0 1; background: $surface; }
    HelpScreen VerticalScroll { height: auto; max-height: 100%; }
    HelpScreen #help-foot { color: $text-muted; }
    """
    BINDINGS = [Binding("escape", "close", "Close", id="dialog.cancel")]

    def __init__(self, keymap: dict[str, str]):
        super().__init__()
        self.keymap = keymap

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for i, (group, rows) in enumerate(help_rows(self.keymap)):
            table.add_row(Text(("\n" if i else "") + group, style="bold underline"), "")
            for r in rows:
                table.add_row(r.keys, r.what)
        self.table = table
        with Vertical():
            yield Label(f"Keys  ({keys_of('help', self.keymap)} or Esc: close)", id="help-title")
            with VerticalScroll():
                yield Static(table, id="help-table")
            yield Label("Rebind any key in ~/.config/moeslots/config.toml, e.g. [keymap] slots = \"f9\" "
                        "(ids: docs/reference.md)", id="help-foot")

    def action_close(self) -> None:
        self.dismiss(None)
