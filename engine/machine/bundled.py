"""The bundled default model (trained for this project, scripts/train/, docs/model.md) and its profiles."""

from __future__ import annotations

from pathlib import Path

from ..errors import EngineError

NAME = "moeslots-tiny-glm4moe"
SLOTS = 16                  # its default slots per layer: a quarter of its 64 experts (the cache at work, visibly)
_ASSETS = Path(__file__).resolve().parents[1] / "assets"


def _profiles_dir() -> Path:
    from ... import profiles

    return Path(profiles.__file__).resolve().parent / "data"


def present() -> bool:
    return (_ASSETS / f"{NAME}.gguf").is_file()


def is_bundled(path: Path) -> bool:
    """Whether `path` is the bundled model's file (however it was spelled)."""
    try:
        return present() and Path(path).expanduser().resolve() == (_ASSETS / f"{NAME}.gguf").resolve()
    except OSError:
        return False


def model() -> Path:
    p = _ASSETS / f"{NAME}.gguf"
    if not p.is_file():
        raise EngineError(f"the bundled model is missing ({p}): reinstall moeslots, or pass a model path")
    return p


def profile(workload: str = "merged") -> Path:
    """workload: code | chat | merged (code + chat, the default plan)."""
    if workload not in ("code", "chat", "merged"):
        raise EngineError(f"no bundled profile for workload {workload!r} (code, chat or merged)")
    p = _profiles_dir() / f"{NAME}-{workload}.csv"
    if not p.is_file():
        raise EngineError(f"the bundled profile is missing ({p}): reinstall moeslots")
    return p
