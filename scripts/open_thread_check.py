"""Whether opening a model leaves the app's replies slow: the engine opened with a first-run calibration (policy auto,
calibration asked for even without a GPU, THREADS threads; by default the bundled model, its profile and slots),
on the calling thread ("caller") or in a thread that ends with the load ("passing", as `moeslots chat` opens it),
then REPLIES replies decoded in a thread of their own, as the app decodes them; each reply's decode tok/s as the
engine reports it, and the threads alive in the process (a thread that computed keeps its OpenMP team parked:
engine.runtime.passing_thread). Each way runs in its own process, twice, taking turns. With a GPU the slots are on
it and the experts pinned. Usage:
  python3 -P scripts/open_thread_check.py [THREADS] [REPLIES] [--model=M.gguf --profile=P --slots=N]
e.g. the 30B-A3B shape on the GPU box: 15 3 --model=/tmp/big.gguf
  --profile=profiles/data/moeslots-donor-qwen3-30b-a3b-chat-sampled.npz --slots=64"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading


def _opt(args: list[str], name: str) -> str | None:
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def one(way: str, threads: int, replies: int, opts: list[str]) -> None:
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp()       # no stored calibration: the load measures one
    from pathlib import Path

    from moeslots.engine.machine import bundled
    from moeslots.engine.native import lib as native
    from moeslots.engine.runtime import engine as E
    from moeslots.engine.runtime import passing_thread
    from moeslots.profiles.policy import Policy

    model, profile, slots = _opt(opts, "model"), _opt(opts, "profile"), _opt(opts, "slots")
    gpu = bool(native.gpus())
    cfg = E.EngineConfig(model=Path(model) if model else bundled.model(),
                         profile=Path(profile) if profile else bundled.profile("merged"),
                         slots=int(slots) if slots else bundled.SLOTS, mtp=False, threads=threads, pack_host=not gpu,
                         mmap=not gpu, policy=Policy("auto"), calibrate="always", max_tokens=128, n_ctx=1024)

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
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = [a for a in sys.argv[1:] if a.startswith("--")]
    if args and args[0] in ("caller", "passing"):
        one(args[0], int(args[1]), int(args[2]), opts)
        return
    try:
        threads = int(args[0]) if args else 2
        replies = int(args[1]) if len(args) > 1 else 3
        int(_opt(opts, "slots") or 0)
    except ValueError:
        sys.exit(__doc__)
    if threads < 1 or replies < 1:
        sys.exit("open_thread_check.py: THREADS and REPLIES are positive counts")
    for name in ("model", "profile"):
        path = _opt(opts, name)
        if path is not None and not os.path.isfile(path):
            sys.exit(f"open_thread_check.py: --{name}={path}: no such file")
    print("| opened on | threads | reply decode tok/s | threads alive |\n|---|---|---|---|", flush=True)
    for way in ("caller", "passing", "caller", "passing"):
        r = subprocess.run([sys.executable, "-P", __file__, way, str(threads), str(replies), *opts],
                           capture_output=True, text=True)
        print("\n".join(x for x in r.stdout.splitlines() if x.startswith("| ")), flush=True)
        if r.returncode != 0:
            sys.exit(f"open_thread_check.py: the {way} run failed: {r.stderr.strip()[-600:]}")


if __name__ == "__main__":
    main()
