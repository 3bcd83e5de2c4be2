"""Whether the CPU's expert rate settles after a model's load, and whether the first-run calibration's plan reads
it as the sessions' plans do: static decodes from the moment the load ends, for SECONDS, at each thread count in
turn. Each round reads the first-run calibration's pair (engine.cpu_rate): 16 one-token decodes at S slots, experts
0..S-1 resident in every layer, under routing that misses the slots and under routing that hits them (the CPU's rate
is the miss reading's extra CPU picks over the time between the two walls); then the same missing routing with S
other experts resident, a shuffled set as a profile gives (the same count of CPU picks: its wall compares directly
with the first miss reading's). In the fourth harness run at 6 threads the calibration's static decodes read 8-10 %
slower than the bench's static rows right before and after them. Uniform replayed routing, experts pinned (mapped
with --mmap). Without a GPU the packs stay in host memory and both pair readings cost about the same: the rate is
then not measurable, and the rows say so.
Usage: python3 -P scripts/h200/settle.py MODEL.gguf [THREADS,...] [SECONDS] [SLOTS] [--mmap]"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.machine.cpu_rate import pair_routes, reading
from moeslots.engine.native import lib as native
from moeslots.engine.native import replay
from moeslots.engine.native.expert_cache import SlotPlan

N = 16          # timed one-token decodes per reading, as the first-run calibration


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args:
        sys.exit(__doc__)
    path = Path(args[0])
    try:
        thread_counts = [int(x) for x in (args[1] if len(args) > 1 else "6,16").split(",")]
        seconds = float(args[2]) if len(args) > 2 else 150.0
        S = int(args[3]) if len(args) > 3 else 64
    except ValueError as e:
        sys.exit(f"settle.py: {e} (THREADS: comma-separated counts, SECONDS and SLOTS: numbers)")
    if min(thread_counts) < 1 or seconds <= 0 or S < 1:
        sys.exit("settle.py: THREADS, SECONDS and SLOTS must be positive")
    mmap = "--mmap" in sys.argv
    pack_host = not native.gpus()
    t0 = time.perf_counter()
    with Model(path, LoadOptions(experts_on_host=True, use_mmap=mmap)) as m:
        loaded = time.perf_counter()
        f = m.facts
        moe = [il for il in f.moe_layers if il < f.n_layer]
        S = max(f.n_expert_used, min(S, f.n_expert - 1))
        print(f"model loaded in {loaded - t0:.1f} s ({'mmap' if mmap else 'pinned'}{', no GPU' if pack_host else ''}); "
              f"{len(moe)} MoE layers, {f.n_expert} experts, {S} slots", flush=True)
        routes = pair_routes(len(moe), f.n_expert, f.n_expert_used, S)             # the calibration's pair
        toks = [int(t) for t in np.random.default_rng(0).integers(0, m.n_vocab - 16, N + 9)]
        low = SlotPlan({il: tuple(range(S)) for il in moe})          # the first-run calibration's plan
        rng = np.random.default_rng(9)
        shuffled = SlotPlan({il: tuple(sorted(int(e) for e in rng.choice(f.n_expert, S, replace=False))) for il in moe})
        ctxs = {t: Context(m, n_ctx=N + 64, threads=t) for t in thread_counts}
        for ctx in ctxs.values():
            ctx.enable_stats(ring_rows=0)
        rows: dict[int, list[tuple[float, float]]] = {t: [] for t in thread_counts}
        print("| s after the load | threads | miss ms | hit ms | CPU picks | CPU GB/s (walls) | miss ms, shuffled plan "
              "| CPU picks |\n" + "|---" * 8 + "|", flush=True)

        def read(ctx: Context, what: str) -> tuple[float, float]:
            """(median ms per token, CPU picks per token) of N one-token decodes under `what`'s routing, read as the
            calibration reads them (without the scheduler's clock: the walls give the rate here)."""
            r = reading(ctx, routes[what], toks, clock=False)
            return r.ms, r.picks

        try:
            while time.perf_counter() - loaded < seconds:
                for threads, ctx in ctxs.items():
                    m.set_slots(low, pack_host=pack_host)
                    (miss, picks), (hit, _) = read(ctx, "miss"), read(ctx, "hit")
                    m.set_slots(shuffled, pack_host=pack_host)
                    other, other_picks = read(ctx, "miss")
                    dt = miss - hit
                    gbps = picks * f.slab_bytes / 1e6 / dt if dt > 0 and not pack_host else 0.0
                    at = time.perf_counter() - loaded
                    rows[threads].append((at, gbps))
                    print(f"| {at:.0f} | {threads} | {miss:.2f} | {hit:.2f} | {picks:.1f} | "
                          + (f"{gbps:.1f}" if gbps else "not measurable")
                          + f" | {other:.2f} | {other_picks:.1f} |", flush=True)
        finally:
            for ctx in ctxs.values():
                replay.set_replay(ctx.ptr, None)
                ctx.close()
            m.set_slots(SlotPlan({}), pack_host=pack_host)
        for threads, rs in rows.items():
            first = [g for at, g in rs if at < 30 and g]
            last = [g for at, g in rs if at >= seconds - 30 and g]
            if first and last:
                print(f"{threads} threads: {np.median(first):.1f} GB/s in the first 30 s, {np.median(last):.1f} in the "
                      f"last 30 s ({np.median(last) / np.median(first):.2f}x)", flush=True)


if __name__ == "__main__":
    main()
