"""SIGTERM and SIGHUP (`kill`, a closed terminal) handled like Ctrl-C where a command has work to save: within
`as_interrupt(...)` they raise Signalled, a KeyboardInterrupt, so the same `except KeyboardInterrupt` / `finally`
that saves on Ctrl-C saves on them too (`moeslots record`)."""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator


class Signalled(KeyboardInterrupt):
    """A signal turned into an interrupt; `signum` says which (exit code 128 + signum)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def as_interrupt(*signums: int) -> Iterator[None]:
    """Within the block these signals raise Signalled; the old handlers are back after it."""
    def handler(signum: int, frame: object) -> None:
        raise Signalled(signum)

    old = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
