"""What `moeslots chat MODEL`, `moeslots` alone and the app's model picker open, and with which settings: flags over
config.toml's [app] table, the remembered last model. Pure decisions (the CLI opens the engine)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Mapping

from ..engine.machine import bundled
from ..profiles.policy import TIER_SIZED, Policy
from .common import UserError


@dataclasses.dataclass(frozen=True)
class ChatSettings:
    """Everything the engine of `chat MODEL` opens with, decided once here (cli.chat.open_engine takes it whole)."""
    profile: Path | None = None
    slots: str | None = None        # a number or "auto"; None: decided when the engine opens (GPU or not)
    mtp: bool = True
    threads: int | None = None
    ctx: int = 0                    # tokens; 0: sized from the model and free memory (engine.window)
    repick: str | None = None
    async_cpu: bool = False
    mmap: bool | str = "auto"       # True / False as asked, else "auto" (engine.hardware decides from free RAM)
    auto_profile: bool = False      # no profile: plan from the first prompt, record and save one per model
    policy: Policy | None = None    # residency, parsed (--policy and --tier, or [app] policy); None: the default,
                                    # auto where a GPU holds the slots, else static (default_policy)


def same_file(a: str | Path | None, b: str | Path) -> bool:
    return bool(a) and Path(a).expanduser().absolute() == Path(b).expanduser().absolute()  # type: ignore[arg-type]


def resolve(model: Path, a: argparse.Namespace, app: Mapping[str, Any], *, explicit: bool = True) -> ChatSettings:
    """Flags override the config. The config's profile and slots belong to its [app] model. explicit=False (a
    model chosen in the picker): --profile, --slots and --repick of the command line belonged to the model it
    started with and are not carried over."""
    same = same_file(app.get("model"), model)
    profile = (a.profile if explicit else None) or (app.get("profile") if same else None)
    slots = (a.slots if explicit else None) or (str(app["slots"]) if same and "slots" in app else None)
    if bundled.is_bundled(model):               # however it was reached: with its own profile and slots
        profile = profile or bundled.profile("merged")
        slots = slots or str(bundled.SLOTS)
    mmap = getattr(a, "mmap", None)
    return ChatSettings(
        profile=Path(profile).expanduser() if profile else None, slots=slots,
        mtp=not getattr(a, "no_mtp", False) and bool(app.get("mtp", True)), threads=getattr(a, "threads", None),
        ctx=getattr(a, "ctx", 0) or 0, repick=getattr(a, "repick", None) if explicit or profile else None,
        async_cpu=bool(getattr(a, "async_cpu", False)),
        mmap=mmap if mmap is not None else app.get("mmap", "auto"),
        auto_profile=not getattr(a, "no_auto_profile", False) and bool(app.get("auto_profile", True)),
        policy=_policy(a, app))


def default_policy(policy: Policy | None, *, gpu: bool, repick: str | None) -> Policy:
    """The policy to open with: as asked, else auto where a GPU holds the slots (without one the slots live in
    host memory and no tier moves anything to a GPU) and no re-picks were asked for (they move the slots), else
    static."""
    return policy or Policy("auto" if gpu and not repick else "static")


def _policy(a: argparse.Namespace, app: Mapping[str, Any]) -> Policy | None:
    """--policy (with --tier), else [app] policy, else None (the default); --repick alone means static (re-picks
    move the slots). A policy that cannot be (a tier beside one that has none, re-picks beside one that moves slots)
    is one line."""
    p = getattr(a, "policy", None) or app.get("policy")
    tier = getattr(a, "tier", None)
    if p is None and getattr(a, "repick", None):
        p = "static"
    if p is None:
        if tier is not None:
            raise UserError(f"--tier D sets the dynamic slots of --policy {', '.join(TIER_SIZED)}: name one")
        return None
    try:
        pol = Policy.parse(str(p), tier)
        pol.check_repick(1 if getattr(a, "repick", None) else 0)
    except ValueError as e:
        raise UserError(str(e)) from None
    return pol


def start_model(app: Mapping[str, Any]) -> tuple[Path | None, str]:
    """`moeslots` alone: [app] model (a pinned default), else the last model used, else None (the bundled model).
    The second value is a notice when the last model is gone."""
    if app.get("model"):
        return Path(app["model"]).expanduser(), ""
    last = app.get("last_model")
    if not last:
        return None, ""
    p = Path(last).expanduser()
    if p.is_file():
        return p, ""
    return None, f"the last model used, {p}, is gone: opened the bundled model (F4 picks another)"


def remember(model: Path) -> str | None:
    """[app] last_model = the model's absolute path; an error line when the config cannot be written."""
    from ..tui import config

    try:
        config.save_app({"last_model": str(Path(model).expanduser().absolute())})
    except (OSError, config.ConfigError) as e:
        return f"could not remember the model in the config: {e}"
    return None
