"""`moeslots chat MODEL` and `moeslots` alone: the engine opened with the settings of moeslots.cli.launch (flags over
config.toml), and the app run on it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from ..engine.api import Engine
from ..profiles.policy import POLICIES
from . import launch
from .common import UserError, config, int_arg


def parse_repick(v: str | None) -> tuple[int, int]:
    if not v or v == "auto":
        return 0, 4
    n, _, m = v.partition(":")
    try:
        return int(n), int(m) if m else 4
    except ValueError:
        raise UserError(f"--repick takes N or N:M (every N tokens, at most M swaps per layer), not {v!r}") from None


def open_engine(model: Path, s: launch.ChatSettings, progress: "Callable[[str], None] | None" = None) -> "Engine":
    """The engine the app runs on: slots as many as fit by default (with a profile, or a GPU to plan from the first
    prompt), the app's threads, re-picks as asked; `--repick auto` decided here, its reason a notice; the residency
    policy (`--policy`; by default auto where a GPU holds the slots, else static; auto is decided when the slots are
    planned, after a first-run calibration whose steps are printed here) said in a notice."""
    from ..engine.machine.threads import app_threads
    from ..engine.native import lib as native
    from ..engine.runtime import passing_thread
    from ..engine.runtime.engine import Engine as LocalEngine
    from ..engine.runtime.engine import EngineConfig
    from ..engine.runtime.residency import AUTO_EVERY

    native.require_patched()
    # the engine's own error lines stay out of the terminal: a load that fails says why in one line of ours (from
    # the kept log), and the app that follows draws the screen (MOESLOTS_VERBOSE=1 shows everything)
    native.set_log_echo(False)
    pack_host = not native.gpus()
    policy = launch.default_policy(s.policy, gpu=not pack_host, repick=s.repick)
    slots = s.slots
    if slots is None:       # a profile, or a GPU to plan from the first prompt (auto profile): as many as fit
        slots = "auto" if s.profile or (s.auto_profile and not pack_host) else "0"
    n_or_auto: int | str = slots if slots == "auto" else int_arg("--slots", slots)
    if isinstance(n_or_auto, int) and n_or_auto < 0:
        raise UserError(f"--slots {n_or_auto}: a slot count is not negative; give 0 (no slots) up to the model's "
                        "experts per layer, or auto")
    repick = s.repick
    every, swaps = parse_repick(repick)
    threads = s.threads or app_threads()       # the app keeps a physical core for its UI (engine/machine/threads.py)
    cfg = EngineConfig(model=model, n_ctx=s.ctx, slots=n_or_auto, profile=s.profile, mtp=s.mtp, threads=threads,
                       pack_host=pack_host, repick_every=every, repick_swaps=swaps, async_cpu=s.async_cpu,
                       mmap=s.mmap, repick_auto_every=AUTO_EVERY if repick == "auto" else 0,
                       auto_profile=s.auto_profile, policy=policy)
    # off this thread: what the load computes (the first-run calibration) leaves no OpenMP team behind on a thread
    # that outlives it, beside each reply's own (engine.runtime.passing_thread)
    eng = passing_thread.run(lambda: LocalEngine(cfg, progress=progress or _progress))
    if pack_host and n_or_auto not in (0, "0"):
        eng.notices.append("no GPU: the slots live in host memory (shows the cache at work; no speed-up)")
    if policy.moves_slots and eng.residency.policy_line:
        eng.notices.append(f"residency: {eng.residency.policy_line}")
    if repick == "auto":
        try:
            eng.notices.append(eng.set_repick_auto())                  # (simulates: computes nothing)
        except BaseException:
            eng.close()
            raise
    return eng


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_app(eng: Engine, model_name: str, remember: bool = True, a: argparse.Namespace | None = None,
            model: Path | None = None) -> int:
    from ..engine.native import lib as native
    from ..tui.app import MoeslotsApp
    from ..tui.store import HistoryError, Store

    keymap = dict(config().get("keymap", {}))
    try:                                  # the chat history: read-only or damaged files are handled (notices);
        store = Store()                   # what cannot be (a newer schema, no way to open it) is one line, exit 2
    except HistoryError as e:
        eng.close()
        raise UserError(str(e)) from None
    native.set_log_echo(False)            # the app draws on the terminal: engine errors reach it as notifications
    if hasattr(eng, "progress_cb"):
        eng.progress_cb = None            # the terminal is the app's now: progress reaches it in snapshots
    app = MoeslotsApp(eng, store=store, model_name=model_name, keymap=keymap, remember=remember)
    app.model_path, app.model_dirs = model, list(config().get("app", {}).get("model_dirs", []))
    app.opener = lambda p, progress=None: chat_engine(p, a or chat_args(p), explicit=False, progress=progress)
    try:
        app.run()
    finally:
        native.set_log_echo(True)
        app.chat_pane.cancel.set()                 # a reply still running in its worker thread stops at the next token
        app.engine.close()                # (waits for that thread; the model picker may have switched engines)
        store.close()
    return app.return_code or 0           # an error the app died of (Textual printed it) is no success


def settings(model: Path, a: argparse.Namespace, *, explicit: bool = True) -> launch.ChatSettings:
    """What `chat MODEL` opens with: the flags over config.toml's [app] table (moeslots.cli.launch)."""
    return launch.resolve(model, a, config().get("app", {}), explicit=explicit)


def chat_engine(model: Path, a: argparse.Namespace, *, explicit: bool = True,
                progress: "Callable[[str], None] | None" = None) -> Engine:
    """The engine for `chat MODEL` (explicit) or a model picked in the app (progress: where its load's steps go
    while the app holds the terminal); remembered as [app] last_model."""
    eng = open_engine(model, settings(model, a, explicit=explicit), progress=progress)
    bad = launch.remember(model)
    if bad:
        eng.notices.append(bad)
    return eng


def cmd_chat(a: argparse.Namespace) -> int:
    model = Path(a.model).expanduser()
    return run_app(chat_engine(model, a), model.name, a=a, model=model)


def cmd_app(a: argparse.Namespace) -> int:
    """`moeslots` alone: the app on the default model: [app] model, else the last model used, else the bundled
    trained model (engine/assets) with its merged code+chat profile and a quarter of its experts in slots;
    `moeslots app --bundled` (`make run`): the bundled model whatever was used last."""
    from ..engine.errors import EngineError
    from ..engine.machine import bundled
    from ..engine.native import lib as native

    native.require_patched()
    target, gone = (None, "") if getattr(a, "bundled", False) else launch.start_model(config().get("app", {}))
    if target is not None:                       # [app] model, else the last model used
        return cmd_chat(chat_args(target))
    try:
        path, prof = bundled.model(), bundled.profile("merged")
    except EngineError as e:
        raise UserError(str(e)) from None
    eng = open_engine(path, launch.ChatSettings(profile=prof, slots=str(bundled.SLOTS)))   # ctx 0: from the model
    if gone:
        eng.notices.append(gone)
    return run_app(eng, path.name, remember=False, model=path)


def chat_args(model: Path) -> argparse.Namespace:
    """`moeslots chat MODEL` with no other flag, as parsed."""
    p = argparse.ArgumentParser(prog="moeslots chat")
    _chat_arguments(p)
    return p.parse_args([str(model)])


def add_parsers(sub: argparse._SubParsersAction) -> None:
    _chat_arguments(sub.add_parser("chat", help="the chat app on MODEL with the expert cache"))
    ap = sub.add_parser("app", help="(default) the chat app on the default model")
    ap.add_argument("--bundled", action="store_true", help="the bundled model, whatever was used last (make run)")
    ap.set_defaults(func=cmd_app)


def _chat_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("model")
    c.add_argument("--profile", help="profile (trace CSV) that picks the resident experts")
    c.add_argument("--slots", help="slots per layer, or 'auto' (default: auto with a profile, else 0)")
    c.add_argument("--no-mtp", action="store_true", help="no MTP drafts even if the model has a NextN block")
    c.add_argument("--async-cpu", action=argparse.BooleanOptionalAction, default=False,
                   help="run the host-memory experts while the GPU computes the resident ones (off by default: two "
                   "more splits per layer cost what the overlap hides)")
    c.add_argument("--mmap", action=argparse.BooleanOptionalAction, default=None,
                   help="--no-mmap: read the experts into pinned host memory (prompts ~5x faster on the H200 box, the "
                   "model's expert bytes held in RAM); --mmap: map the file. Default: pinned when the free RAM holds "
                   "the experts + 10 %% + 4 GiB, else mmap (config: [app] mmap = true|false)")
    c.add_argument("--no-auto-profile", action="store_true", help="without --profile: no slots planned from the "
                   "first prompt, no profile recorded for this model or taken from an earlier session "
                   "(config: [app] auto_profile = false)")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--ctx", type=int, default=0, metavar="TOKENS", help="the context: how much of the chat the "
                   "model reads (when a chat outgrows it, its oldest turns leave it; the history keeps them). "
                   "Default: the model's trained length, at most 32768, and at most what lets the KV cache take a "
                   "quarter of the free VRAM (with a GPU) or RAM")
    c.add_argument("--repick", metavar="N[:M]|auto", help="re-pick residents every N decode tokens, at most M swaps "
                   "per layer (default: static); auto: plan from the profile's first half, score each N on its second "
                   "half with this machine's calibration, then decide again every 256 tokens on the chat's own routing "
                   "(pays mostly with --no-mmap and a drifting workload)")
    c.add_argument("--policy", choices=POLICIES, default=None, help="residency (default: auto where a GPU holds "
                   "the slots, else static): static (the profile's experts stay), hybrid (the last D of each layer's "
                   "slots follow the routing: misses computed on the CPU or uploaded now, whichever this machine's "
                   "costs say), dynamic (all slots do), fetch (the last D "
                   "slots follow the routing stepped by the GPU itself: every miss fetched from pinned memory, none on "
                   "the CPU, no round trip to the host; needs --no-mmap), fetch-split (the same, the CPU computing a "
                   "share of each layer's misses while the GPU copies the others), auto (simulated on the profile "
                   "under this machine's calibration; config: [app] policy)")
    c.add_argument("--tier", type=int, metavar="D", help="--policy hybrid|fetch|fetch-split: dynamic slots per layer "
                   "(default S/4; fetch and fetch-split S/2)")
    c.set_defaults(func=cmd_chat)
