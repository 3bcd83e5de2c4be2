"""What the app's replies decode at, reply after reply, with each reply on a thread of its own that ends with it (as
the app runs them: engine.runtime.passing_thread) and, for comparison, on the thread Textual's worker pool gives
the reply (kept and reused: a thread that decoded keeps its OpenMP team parked beside the next one's). The real app,
headless (tui.appbench, as `moeslots bench app` drives it), on the bundled model with 16 slots in host memory, MTP
off, THREADS threads, RUNS runs of REPLIES replies of up to 128 tokens each, each way in its own process, taking
turns. Prints each reply's decode tok/s as the engine reports it.
Usage: python3 -P scripts/app_reply_threads.py [THREADS] [RUNS] [REPLIES]"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path


def one(way: str, threads: int, runs: int, replies: int) -> None:
    from moeslots.engine.machine import bundled
    from moeslots.engine.runtime import passing_thread
    from moeslots.engine.runtime.engine import Engine, EngineConfig
    from moeslots.tui import appbench, chatpane

    if way == "pool":                                 # the reply decodes where Textual's worker runs it
        class Inline:
            @staticmethod
            def run(fn, name=None):  # type: ignore[no-untyped-def]
                return fn()

        chatpane.passing_thread = Inline              # type: ignore[assignment]
    cfg = EngineConfig(model=bundled.model(), profile=bundled.profile("merged"), slots=16, mtp=False,
                       threads=threads, pack_host=True, max_tokens=128, n_ctx=1024)
    eng = passing_thread.run(lambda: Engine(cfg))
    try:
        for i in range(runs):
            with tempfile.TemporaryDirectory() as d:
                r = asyncio.run(appbench._run_app_side(eng, appbench.PROMPT, replies, Path(d), 600))
            print(f"| {way} | {threads} | {i + 1} | {' '.join(f'{x:.0f}' for x in r.tok_s)} |", flush=True)
    finally:
        eng.close()


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] in ("own", "pool"):
        one(args[0], int(args[1]), int(args[2]), int(args[3]))
        return
    try:
        threads, runs, replies = (int(args[i]) if len(args) > i else d for i, d in enumerate((2, 3, 4)))
    except ValueError:
        sys.exit(__doc__)
    if min(threads, runs, replies) < 1:
        sys.exit("app_reply_threads.py: THREADS, RUNS and REPLIES are positive counts")
    print("| reply threads | threads | run | each reply's decode tok/s |\n|---|---|---|---|", flush=True)
    for way in ("pool", "own"):
        r = subprocess.run([sys.executable, "-P", __file__, way, str(threads), str(runs), str(replies)],
                           capture_output=True, text=True)
        print("\n".join(x for x in r.stdout.splitlines() if x.startswith("| ")), flush=True)
        if r.returncode != 0:
            sys.exit(f"app_reply_threads.py: the {way} run failed: {r.stderr.strip()[-600:]}")


if __name__ == "__main__":
    main()
