"""How an Engine is closed: never under a reply that is still decoding on another thread.

close() marks the engine closed first (a reply stops at its next token), then waits up to its timeout for the
reply to let go of the engine (state.busy). If it does, everything is freed here. If not, a prefill or a first-run
calibration is still running there (they check no cancel): the reply frees everything itself as it ends
(`free_if_left`), rather than this thread freeing it under the reply. At interpreter exit (close_at_exit) what a
reply still holds is left to the OS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..llm.model import untrack

if TYPE_CHECKING:
    from .engine import Engine


def close_after(eng: "Engine", timeout: float, *, leave: bool) -> None:
    eng._closed = True             # first: a reply generating on another thread stops at its next token
    busy = eng.state.busy if hasattr(eng, "state") else None
    got = busy.acquire(timeout=timeout) if busy is not None else False
    if busy is not None and not got:
        if leave:
            untrack(getattr(eng, "mtp", None), getattr(eng, "ctx", None), getattr(eng, "model", None))
        else:
            eng._free_later = True     # the reply still holding the engine frees it as it ends
        return
    try:
        free(eng)
    finally:
        if got and busy is not None:
            busy.release()


def free_if_left(eng: "Engine") -> None:
    """After a reply let go of the engine: free it if close() gave up waiting for that reply."""
    if eng._free_later and eng.state.busy.acquire(blocking=False):
        try:
            free(eng)
        finally:
            eng.state.busy.release()


def free(eng: "Engine") -> None:
    if (auto := getattr(eng, "_auto", None)) is not None:
        auto.close()                               # the last reply's profile save finishes first
    if getattr(eng, "residency", None) is not None:
        eng.residency.close()
    with eng.state.lock:
        if (mtp := getattr(eng, "mtp", None)) is not None:
            mtp.close()
            eng.mtp = None
        if getattr(eng, "ctx", None):
            eng.ctx.close()
        eng.model.close()
