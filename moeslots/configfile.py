"""The config file, $XDG_CONFIG_HOME/moeslots/config.toml: where it is, and an atomic TOML write that keeps every
other table; where moeslots keeps its data ($XDG_DATA_HOME/moeslots). Shared by the app's settings (tui/config.py)
and the engine's calibration (engine/machine/calibrate.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "moeslots"


def path() -> Path:
    return config_dir() / "config.toml"


def data_dir() -> Path:
    """$XDG_DATA_HOME/moeslots: chat history, exports, recorded profiles."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "moeslots"


def write_atomic(cfg: dict[str, Any], p: Path | None = None) -> Path:
    """Write the whole document to p (default: the config file) through a temporary file in the same folder."""
    import tomli_w

    from . import atomicfile

    p = p or path()
    with atomicfile.replace(p, "wb") as fh:
        tomli_w.dump(cfg, fh)
    return p
