"""Helpers for Textual pilot tests (tests/ is on sys.path)."""

from __future__ import annotations

import time
from typing import Any, Callable


async def wait_until(pilot: Any, cond: Callable[[], Any], timeout: float = 8.0, step: float = 0.03) -> None:
    """Let the app run until `cond()` holds; fails after `timeout` seconds."""
    t0 = time.monotonic()
    while not cond():
        await pilot.pause(step)
        assert time.monotonic() - t0 < timeout, "timed out"
