"""`moeslots`: the parser (each command group adds its own: engine.py, models.py, chat.py, profiles.py, bench.py) and
main(), which turns every user error into one line on stderr with exit code 2 (never a traceback). Heavy modules are
imported inside the commands, so `moeslots engine build` works before the engine exists."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .. import __version__
from . import bench, chat, engine, models, profiles
from .common import UserError, err


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moeslots", description="moeslots: a terminal chat for local MoE LLMs that "
                                "keeps a profile-chosen set of experts per layer in VRAM")
    p.add_argument("--version", action="version", version=f"moeslots {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    engine.add_parsers(sub)          # engine build, doctor
    models.add_parsers(sub)          # synth, generate, models, demo
    bench.add_parsers(sub)           # bench decode|compare|mtp|repick|app
    profiles.add_parsers(sub)        # record, profile merge|show, simulate
    chat.add_parsers(sub)            # chat, app (the default)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from ..engine.errors import BuildError, EngineError
    from ..profiles.trace import TraceError

    parser = build_parser()
    a = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.cmd is None:
        a = parser.parse_args(["app"])
    try:
        return a.func(a)
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    except (UserError, EngineError, BuildError, TraceError) as e:   # a profile that cannot be read or written: the
        err(str(e))                                                  # line says which
        return 2
    except OSError as e:                         # a full disk, a folder where a file goes, no permission...
        err(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e))
        return 2
