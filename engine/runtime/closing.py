"""How an Engine is closed: never under a reply that is still decoding on another thread.

close() marks the engine closed first (a reply stops at its next token), then waits up to its timeout for the
reply to let go of the engine (state.busy). If it does, everything is freed here. If not, a prefill or a first-run
calibration is still running there (they check no cancel): the reply frees everything itself as it ends
(`_free_if_left`), rather than this thread freeing it under the reply. At interpreter exit (close_at_exit) what a
reply still holds is left to the OS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..llm.model import untrack

if TYPE_CHECKING:
    from .state import EngineState


class Closing:
    """The Engine's closing, as a part it is built from (engine.engine.Engine)."""

    _closed: bool
    _free_later: bool
    state: "EngineState"
    model: Any
    mtp: Any

    def close(self, timeout: float = 30.0) -> None:
        """Free everything; waits (up to `timeout`) for a reply in progress to finish — cancel it first — so a
        worker thread never decodes on a freed model (the app quits this way). A reply still running after that
        stops at its next token and frees everything itself as it ends."""
        self._close_after(timeout, leave=False)

    def close_at_exit(self) -> None:
        """The interpreter is exiting (engine.model's atexit hook): close unless a reply is still being generated
        on another thread; then leave the native objects to the OS rather than free them under that thread."""
        self._close_after(2.0, leave=True)

    def _close_after(self, timeout: float, *, leave: bool) -> None:
        self._closed = True            # first: a reply generating on another thread stops at its next token
        busy = self.state.busy if hasattr(self, "state") else None
        got = busy.acquire(timeout=timeout) if busy is not None else False
        if busy is not None and not got:
            if leave:
                untrack(getattr(self, "mtp", None), getattr(self, "ctx", None), getattr(self, "model", None))
            else:
                self._free_later = True    # the reply still holding the engine frees it as it ends
            return
        try:
            self._free()
        finally:
            if got and busy is not None:
                busy.release()

    def _free_if_left(self) -> None:
        """After a reply let go of the engine: free it if close() gave up waiting for that reply."""
        if self._free_later and self.state.busy.acquire(blocking=False):
            try:
                self._free()
            finally:
                self.state.busy.release()

    def _free(self) -> None:
        if (auto := getattr(self, "_auto", None)) is not None:
            auto.close()                               # the last reply's profile save finishes first
        if getattr(self, "residency", None) is not None:
            self.residency.close()  # type: ignore[attr-defined]
        with self.state.lock:
            if (mtp := getattr(self, "mtp", None)) is not None:
                mtp.close()
                self.mtp = None
            if getattr(self, "ctx", None):
                self.ctx.close()  # type: ignore[attr-defined]
            self.model.close()
