"""Whether opening a model leaves the app's replies slow: the engine opened with a first-run calibration (policy auto,
calibration asked for even without a GPU, the bundled model and its profile, THREADS threads), on the calling thread
("caller") or in a thread that ends with the load ("passing", as `moeslots chat` opens it), then REPLIES replies
decoded in a thread of their own, as the app decodes them; each reply's decode tok/s as the engine reports it, and
the threads alive in the process (a thread that computed keeps its OpenMP team parked: engine.runtime.passing_thread).
Each way runs in its own process. Usage: python3 -P scripts/open_thread_check.py [THREADS] [REPLIES]"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading


def one(way: str, threads: int, replies: int) -> None:
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp()       # no stored calibration: the load measures one
    from moeslots.engine.machine import bundled
    from moeslots.engine.runtime import engine as E
    from moeslots.engine.runtime import passing_thread
    from moeslots.profiles.policy import Policy

    cfg = E.EngineConfig(model=bundled.model(), profile=bundled.profile("merged"), slots=bundled.SLOTS, mtp=False,
                         threads=threads, pack_host=True, policy=Policy("auto"), calibrate="always", max_tokens=128,
                         n_ctx=1024)

    def make() -> E.Engine:
        return E.Engine(cfg, progress=lambda s: None)

    eng = make() if way == "caller" else passing_thread.run(make)
    got: list[float] = []

    def reply() -> None:
        for _ in range(replies):
            eng.new_chat()
            list(eng.chat([E.Message("user", "Write a Python function that reads a CSV file.")]))
            got.append(eng.snapshot().tok_s_last)

    t = threading.Thread(target=reply)
    t.start()
    t.join()
    print(f"| {way} | {threads} | {' '.join(f'{x:.0f}' for x in got)} | {len(os.listdir('/proc/self/task'))} |",
          flush=True)
    eng.close()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("caller", "passing"):
        one(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
        return
    try:
        threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
        replies = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    except ValueError:
        sys.exit(__doc__)
    if threads < 1 or replies < 1:
        sys.exit("open_thread_check.py: THREADS and REPLIES are positive counts")
    print("| opened on | threads | reply decode tok/s | threads alive |\n|---|---|---|---|", flush=True)
    for way in ("caller", "passing", "caller", "passing"):
        r = subprocess.run([sys.executable, "-P", __file__, way, str(threads), str(replies)], capture_output=True,
                           text=True)
        print("\n".join(x for x in r.stdout.splitlines() if x.startswith("| ")) or r.stderr[-400:], flush=True)


if __name__ == "__main__":
    main()
