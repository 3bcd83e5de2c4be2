"""The model picker (F4): the GGUFs found on this machine (engine.discovery: Hugging Face cache, LM Studio,
[app] model_dirs, the current folder) with size, arch, experts and whether they fit; Enter switches the app to one.

The screen only returns the chosen path; the switch itself is tui/modelswitch.py's (a worker): it closes the
running engine and opens the chosen model through the app's opener (the CLI's, which also remembers it as [app]
last_model); the chat goes on with the new model (its next reply re-reads the chat). When the new model fails to
open, the previous one is opened again. Switching, below, stands in for the engine meanwhile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from ...engine.api import Snapshot
from ...engine.errors import EngineError
from ...engine.machine import discovery

Scan = Callable[[], discovery.Survey]


class ModelsScreen(ModalScreen["Path | None"]):
    """Lists the survey (run on a worker thread: headers only, but a cache may hold many files); Enter on a usable
    row dismisses with its path, Esc with None."""

    DEFAULT_CSS = """
    ModelsScreen { align: center middle; }
    ModelsScreen > Vertical { width: 90%; height: 80%; border: round $accent; padding: 0 1; background: $surface; }
    ModelsScreen DataTable { height: 1fr; }
    ModelsScreen #models-status { color: $text-muted; }
    """
    BINDINGS = [("escape", "cancel", "Close")]

    def __init__(self, scan: Scan, current: Path | None = None):
        super().__init__()
        self.scan, self.current = scan, current
        self.survey: discovery.Survey | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Models  (Enter: switch to it · Esc: close)", id="models-title")
            yield Label("searching…", id="models-status")
            yield DataTable(id="models-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        t.add_columns("", "model", "size", "arch", "experts", "fits here")
        self.load()

    @work(thread=True, exclusive=True)
    def load(self) -> None:
        try:
            s = self.scan()
        except Exception as e:  # noqa: BLE001 - an unreadable folder must not end the app
            self.app.call_from_thread(self._status, f"[red]could not search for models: {e}[/]")
            return
        self.app.call_from_thread(self._fill, s)

    def _status(self, text: str) -> None:
        self.query_one("#models-status", Label).update(text)

    def _fill(self, s: discovery.Survey) -> None:
        self.survey = s
        t = self.query_one(DataTable)
        cur = self.current.resolve() if self.current and self.current.exists() else None
        for i, (m, f) in enumerate(s.models):
            mark = "●" if cur is not None and m.found.path.resolve() == cur else ""
            t.add_row(mark, m.found.label, discovery.size_text(m.size), m.arch or "?",
                      f"{m.n_expert} (k={m.k})" if m.n_expert else "-", f.line, key=str(i))
        where = ", ".join(str(r.path) for r in s.searched)
        self._status(f"{s.machine} · {len(s.models)} found in {where}" if s.models else
                     f"{s.machine} · no GGUF files in {where} (add folders with [app] model_dirs)")
        t.focus()

    @on(DataTable.RowSelected)
    def chosen(self, event: DataTable.RowSelected) -> None:
        if self.survey is None or event.row_key.value is None:
            return
        m, _ = self.survey.models[int(event.row_key.value)]
        if m.error:
            self._status(f"[red]{m.found.label}: {m.error}[/]")
            return
        self.dismiss(m.found.path)

    def action_cancel(self) -> None:
        self.dismiss(None)


class Switching:
    """Stands in for the engine (engine.api.Engine) while one is closed and the next opened (the app is marked busy
    meanwhile, so the chat, slot and model keys wait): the inspector draws an empty cache, nothing touches a freed
    model."""

    profile: Path | None = None
    recorded_tokens = 0

    def __init__(self, path: Path):
        self.name = path.name
        self.load_line = f"opening {path.name}…"
        self.notices: list[str] = []

    def say(self, line: str) -> None:
        """A step of the load (the first-run calibration), from the opening thread: the inspector's load line."""
        self.load_line = f"opening {self.name}: {line.strip()}"

    def snapshot(self) -> Snapshot:
        return Snapshot("", self.load_line, (), 0.0, 0.0, 0.0, 0.0, (), 0.0, 0, 0, 0, False, True)

    def _busy(self, *a: Any, **k: Any) -> Any:
        raise EngineError("switching models: a moment")

    chat = set_slots = slots_info = set_repick = stop_recording = use_profile = _busy

    def profile_overlap(self, path: Path) -> float | None:
        return None

    def start_recording(self) -> None:
        pass

    def new_chat(self) -> None:
        pass

    def close(self) -> None:
        pass
