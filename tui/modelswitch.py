"""Switching to another model (F4): the picker (tui/screens/models.py) returns a path; a Textual worker thread
(named SWITCH_WORKER) takes the running engine out of the app, closes it and opens the chosen model through the
app's opener (the CLI's, which also remembers it as [app] last_model); when that fails the previous model is opened
again, and when that fails too the app exits saying why. The end is posted to the App as EngineSwitched
(tui/messages.py): the App puts the new engine in and tells its parts.

A plain object the App owns. It never writes the App's fields: the engine is handed over through `swap`, a callable
the App gives, run on the UI thread (so no snapshot is half-way through the old engine when it goes), and a stand-in
(Switching) is the app's engine meanwhile: the inspector draws an empty cache, nothing touches a freed model."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable

from textual.app import App
from textual.worker import Worker

from ..engine.api import Engine
from ..engine.machine import discovery
from .messages import EngineSwitched
from .screens.models import ModelsScreen, Switching

SWITCH_WORKER = "switch-model"          # the worker's name (and group) in App.workers

Opener = Callable[..., Engine]           # (path, progress=...) -> a new engine


class ModelSwitch:
    def __init__(self, app: App[Any], swap: Callable[[Engine], Engine]) -> None:
        self.app = app
        self.swap = swap                # on the UI thread: puts an engine in the app, returns the one it replaced

    def pick(self, dirs: list[str], current: Path | None, then: Callable[[Path], None]) -> None:
        """The picker over the models found (discovery.survey of `dirs`, on its own worker); `then` gets the path
        chosen (Esc: not called)."""
        self.app.push_screen(ModelsScreen(lambda: discovery.survey(dirs), current),
                             callback=lambda path: then(path) if path is not None else None)

    def start(self, path: Path, opener: Opener, old_path: Path | None) -> Worker[None]:
        """Opens `path` on a worker thread (one at a time); EngineSwitched is posted to the App when it ends."""
        return self.app.run_worker(functools.partial(self._run, path, opener, old_path), name=SWITCH_WORKER,
                                   group=SWITCH_WORKER, thread=True, exclusive=True, exit_on_error=False)

    def _run(self, path: Path, opener: Opener, old_path: Path | None) -> None:
        """Worker thread: the old engine out (on the UI thread) and closed, the new one opened; on failure the old
        model again."""
        app = self.app
        stand_in = Switching(path)
        old = app.call_from_thread(self.swap, stand_in)
        old.close()
        try:
            new = opener(path, progress=stand_in.say)
        except Exception as e:  # noqa: BLE001 - any failure to open is the user's to read; the app goes on
            msg = f"could not open {path.name}: {e}"
            if old_path is None:
                app.call_from_thread(app.exit, message=msg + " (and no previous model to go back to)")
                return
            try:
                new = opener(old_path, progress=stand_in.say)
            except Exception as e2:  # noqa: BLE001
                app.call_from_thread(app.exit, message=f"{msg}; reopening {old_path.name} failed too: {e2}")
                return
            app.post_message(EngineSwitched(new, old_path, msg))
            return
        app.post_message(EngineSwitched(new, path))
