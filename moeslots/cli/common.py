"""What every command shares: UserError (one line on stderr, exit code 2), the config, number arguments."""

from __future__ import annotations

import sys
from typing import Callable


class UserError(Exception):
    """An error caused by input or environment: printed as one line, exit code 2."""


def err(msg: str) -> None:
    """One line, whatever the message carries (a file's strings may hold newlines or terminal escapes)."""
    line = " ".join(msg.split("\n")).translate({c: "\ufffd" for c in (*range(32), 127)})
    print(f"moeslots: error: {line}", file=sys.stderr)


def config() -> dict:
    """config.toml (tui.config), a damaged one as a UserError."""
    from ..tui import config as cfg

    try:
        return cfg.load()
    except cfg.ConfigError as e:
        raise UserError(str(e)) from None


def int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} takes comma-separated numbers, got {text!r}") from None


def int_arg(flag: str, v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise UserError(f"{flag} takes a number or 'auto', not {v!r}") from None


def rich_bytes_progress(console, label: str) -> Callable[[int, int], None]:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    prog = Progress(TextColumn(f"[bold]{label}[/]"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                    console=console, transient=True)
    state: dict = {}

    def cb(done: int, total: int) -> None:
        if "task" not in state:
            prog.start()
            state["task"] = prog.add_task(label, total=total)
        prog.update(state["task"], completed=done, total=total)
        if done >= total:
            prog.stop()

    return cb
