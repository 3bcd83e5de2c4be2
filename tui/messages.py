"""The messages the app's parts post up to the App (tui/app.py), which handles them: a reply ended (from the chat
pane, tui/chatpane.py), the model switch ended (from its worker, tui/modelswitch.py), a notice from a worker thread
(tui/actions.py: a slot change made off the UI thread). Parts never write the App's fields: they post one of these."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual.message import Message
from textual.notifications import SeverityLevel

if TYPE_CHECKING:
    from ..engine.api import Engine, TurnStats


class ReplyDone(Message):
    """A reply ended (done, stopped or failed): the chat pane settles its log, history and prompt box first, then
    the App (its inspector marks, the engine's notices) and, last, `ChatPane.end_reply`."""

    def __init__(self, text: str, stats: "TurnStats | None", error: str | None = None) -> None:
        super().__init__()
        self.text, self.stats, self.error = text, stats, error

    @property
    def cancelled(self) -> bool:
        return bool(self.stats and self.stats.cancelled)

    @property
    def said(self) -> bool:
        """The reply said something (or ended normally): it is in the history; else the question went back."""
        return bool(self.text.strip()) or not (self.cancelled or self.error)


class EngineSwitched(Message):
    """The model switch ended: `engine` is open on `path` (the chosen model, or the previous one again when the
    chosen one failed to open: `error` says why)."""

    def __init__(self, engine: "Engine", path: Path, error: str = "") -> None:
        super().__init__()
        self.engine, self.path, self.error = engine, path, error


class Notice(Message):
    """A toast, posted from a worker thread (App.notify is for the UI thread)."""

    def __init__(self, text: str, severity: SeverityLevel = "information", timeout: float | None = None) -> None:
        super().__init__()
        self.text, self.severity, self.timeout = text, severity, timeout
