"""$XDG_CONFIG_HOME/moeslots/config.toml: read with tomllib, written (atomically) with tomli-w.

    [app]                 # defaults for `moeslots` / `moeslots chat`; command-line flags override them
    model = "/models/qwen3.6-35b-a3b-q4_k_m.gguf"
    profile = "/profiles/merged.csv"
    slots = "auto"        # or a number
    mtp = true
    mmap = false          # experts in pinned host memory (true: mapped; unset: pinned when the free RAM holds them)
    auto_profile = true   # no profile: plan slots from the first prompt, record one per model (default true)
    model_dirs = ["~/models"]   # more folders `moeslots models` and the picker (F4) search
    last_model = "..."    # written by the app: `moeslots` alone reopens it
    [keymap]              # binding id = keys
    record = "ctrl+g"
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from .. import configfile
from ..profiles.policy import POLICIES

APP_KEYS: dict[str, type | tuple[type, ...]] = {
    "model": str, "profile": str, "slots": (str, int), "mtp": bool, "mmap": bool, "auto_profile": bool,
    "model_dirs": list, "last_model": str, "policy": str}


class ConfigError(ValueError):
    pass


def path() -> Path:
    return configfile.path()


def load(p: Path | None = None) -> dict[str, Any]:
    p = p or path()
    if not p.exists():
        return {}
    try:
        cfg = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{p}: {e}") from None
    app = cfg.get("app", {})
    if not isinstance(app, dict):
        raise ConfigError(f"{p}: [app] must be a table")
    for k, v in app.items():
        if k not in APP_KEYS:
            raise ConfigError(f"{p}: unknown key app.{k} (known: {', '.join(APP_KEYS)})")
        if not isinstance(v, APP_KEYS[k]) or (isinstance(v, list) and not all(isinstance(x, str) for x in v)):
            raise ConfigError(f"{p}: app.{k} has the wrong type")
        if k == "policy" and v not in POLICIES:
            raise ConfigError(f"{p}: app.policy is one of {', '.join(POLICIES)}, not {v!r}")
    km = cfg.get("keymap", {})
    if not isinstance(km, dict) or not all(isinstance(v, str) for v in km.values()):
        raise ConfigError(f"{p}: [keymap] maps binding ids to key strings")
    return cfg


def save_app(values: dict[str, Any], p: Path | None = None) -> None:
    """Update [app] keys, keeping everything else in the file."""
    p = p or path()
    cfg = load(p)
    cfg.setdefault("app", {}).update({k: v for k, v in values.items() if v is not None})
    configfile.write_atomic(cfg, p)
