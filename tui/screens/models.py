"""The model picker (F4): the GGUFs found on this machine (engine.discovery: Hugging Face cache, LM Studio,
[app] model_dirs, the current folder) with size, arch, experts and whether they fit; Enter switches the app to one.

Switching closes the running engine and opens the chosen model through the app's opener (the CLI's, which also
remembers it as [app] last_model); the chat goes on with the new model (its next reply re-reads the chat). When the
new model fails to open, the previous one is opened again.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from ...engine import discovery
from ...engine.api import Engine, Snapshot
from ...engine.errors import EngineError

if TYPE_CHECKING:
    from ..app import MoeslotsApp

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


def open_picker(app: "MoeslotsApp") -> None:
    if app._generating:
        app.notify("stop the reply first (Esc)", severity="warning")
        return

    def scan() -> discovery.Survey:
        return discovery.survey(app.model_dirs)

    def picked(path: Path | None) -> None:
        if path is not None:
            switch_model(app, path)

    app.push_screen(ModelsScreen(scan, app.model_path), callback=picked)


def switch_model(app: "MoeslotsApp", path: Path) -> None:
    if app.model_path is not None and path.resolve() == app.model_path.resolve():
        app.notify(f"{path.name} is the model in use")
        return
    if app.opener is None:
        app.notify(f"this app cannot open another model: run `moeslots chat {path}`", severity="warning")
        return
    app.notify(f"opening {path.name}…")
    app._generating = True                 # busy until _switched: no reply, slot change or new chat meanwhile
    threading.Thread(target=_switch, args=(app, path), name="moeslots-switch", daemon=True).start()


def _switch(app: "MoeslotsApp", path: Path) -> None:
    """Worker thread: the old engine is taken out of the app (on the UI thread: no snapshot is half-way through it)
    and closed, then the new model opened; on failure the old model is opened again."""
    assert app.opener is not None
    old, old_path = app.engine, app.model_path
    stand_in = Switching(path)
    app.call_from_thread(setattr, app, "engine", stand_in)
    old.close()
    try:
        new = app.opener(path, progress=stand_in.say)
    except Exception as e:  # noqa: BLE001 - any failure to open is the user's to read; the app goes on
        msg = f"could not open {path.name}: {e}"
        if old_path is None:
            app.call_from_thread(app.exit, message=msg + " (and no previous model to go back to)")
            return
        try:
            new = app.opener(old_path, progress=stand_in.say)
        except Exception as e2:  # noqa: BLE001
            app.call_from_thread(app.exit, message=f"{msg}; reopening {old_path.name} failed too: {e2}")
            return
        app.call_from_thread(_switched, app, new, old_path, msg)
        return
    app.call_from_thread(_switched, app, new, path, "")


def _switched(app: "MoeslotsApp", engine: Engine, path: Path, error: str) -> None:
    app.engine, app.model_path, app.model_name = engine, path, path.name
    app._generating = False
    app.sub_title = path.name
    app._notices_seen = 0
    app._repick_seen = engine.snapshot().repick_every
    if error:
        app.notify(error, severity="error", timeout=12)
    else:
        # a chat belongs to its model: the one switched to continues its own last chat, or starts one
        mine = app.store.last_chat(path.name)
        chat = mine or app.store.new_chat(app.store.system(app.chat_id), model=path.name)
        if chat != app.chat_id:
            app.call_later(app.show_chat, chat)
        app.notify(f"switched to {path.name}: " + ("its last chat" if mine else "a new chat for it")
                   + " (Ctrl+L lists every chat)", timeout=8)
    app._say_new_notices()
    app.refresh_inspector()
