"""`moeslots bench app MODEL [--slots N] [--profile P] [--no-mtp] [--threads T] [-n 128] [--replies R] [--json F]`:
the chat app driven headless (Textual pilot, 160x48) beside the same engine alone, both decode tok/s and the
ratio (tui/appbench.py does the measuring)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from .common import UserError


def add_parser(sub: Any) -> None:
    """`moeslots bench app`, a subcommand of `bench` (moeslots.cli.bench)."""
    p = sub.add_parser("app", help="the real app driven headless beside the same engine alone",
                       description="the real app, driven headless, beside the same engine alone: decode tok/s "
                       "of both and their ratio")
    p.add_argument("model")
    p.add_argument("--slots", type=int, default=None,
                   help="slots per layer (needs --profile; the bundled model has its own; default 0)")
    p.add_argument("--profile", help="profile (trace CSV) that picks the resident experts")
    p.add_argument("--no-mtp", action="store_true", help="no MTP drafts")
    p.add_argument("--mtp-always", action="store_true", help="draft every step (default: drafting goes off while "
                   "acceptance is below the measured break-even, as in the app)")
    p.add_argument("--threads", type=int, default=None,
                   help="llama.cpp threads (default: as the app, physical cores minus one)")
    p.add_argument("-n", "--n-tokens", type=int, default=128, help="decode tokens per reply at most")
    p.add_argument("--replies", type=int, default=3, help="replies per side (the median is reported)")
    p.add_argument("--prompt", default=None, help="the user turn (default: a coding question)")
    p.add_argument("--ctx", type=int, default=2048, help="context length (at least -n + 256)")
    p.add_argument("--no-mmap", action="store_true", help="experts read into pinned host memory, not mapped")
    p.add_argument("--json", help="also write the result as JSON")
    p.set_defaults(func=cmd_bench_app)


def cmd_bench_app(a: argparse.Namespace) -> int:
    from ..engine.machine import bundled
    from ..engine.machine.threads import app_threads
    from ..engine.native import lib as native
    from ..engine.runtime import passing_thread
    from ..engine.runtime.engine import Engine, EngineConfig
    from ..tui import appbench

    model = Path(a.model)
    if not model.is_file():
        raise UserError(f"{model}: no such model file")
    for flag, v, lo in (("-n", a.n_tokens, 1), ("--replies", a.replies, 1), ("--threads", a.threads, 1),
                        ("--slots", a.slots, 0), ("--ctx", a.ctx, 64)):
        if v is not None and v < lo:
            raise UserError(f"{flag} must be >= {lo}, not {v}")
    native.require_patched()
    profile = Path(a.profile) if a.profile else None
    if profile is not None and not profile.is_file():
        raise UserError(f"{profile}: no such profile")
    if a.slots and profile is None:
        if model.resolve() != bundled.model().resolve():
            raise UserError("--slots needs --profile P (a recorded trace) for this model")
        profile = bundled.profile("merged")
    if a.n_tokens + 256 > a.ctx:
        raise UserError(f"-n {a.n_tokens} needs --ctx of at least {a.n_tokens + 256}")
    threads = a.threads or app_threads()
    pack_host = not native.gpus()
    if a.no_mtp and a.mtp_always:
        raise UserError("--no-mtp and --mtp-always contradict each other")
    cfg = EngineConfig(model=model, n_ctx=a.ctx, slots=a.slots or 0, profile=profile, mtp=not a.no_mtp,
                       mtp_auto=not a.mtp_always, threads=threads, pack_host=pack_host, mmap=not a.no_mmap,
                       max_tokens=a.n_tokens)
    eng = passing_thread.run(lambda: Engine(cfg))        # opened as `chat` opens it: nothing computed on this thread
    try:
        mtp = eng.mtp is not None
        res = appbench.run(eng, model=model.name, slots=a.slots or 0, threads=threads, mtp=mtp, n_tokens=a.n_tokens,
                           replies=a.replies, prompt=a.prompt or appbench.PROMPT,
                           log=lambda m: print(m, file=sys.stderr))
    finally:
        eng.close()
    print(res.render())
    if a.json:
        out = dataclasses.asdict(res) | {"ratio": res.ratio, "engine_median": res.engine.median,
                                         "app_median": res.app.median}
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0
