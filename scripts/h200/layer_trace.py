"""Where a decode token's time goes, per policy and thread count, from the scheduler's clock (patch 0006): per token
and per MoE layer, the CPU splits' wait for the GPU, input copies and compute, the GPU splits' wait, copies and
launches, and what the clock did not see. Also: the first-run calibration twice at each thread count (how far two
readings of the same machine differ), and static timed before and after each GPU-stepped tier in two orders (whether
a tier leaves the static cache slower). Random-token routing (a uniform replay table), experts pinned.
Usage: python3 -P scripts/h200/layer_trace.py MODEL.gguf [THREADS,...] [SLOTS,...|-] [TOKENS] [CALIBRATIONS]
(SLOTS "-": the calibrations alone, CALIBRATIONS of them per thread count, default 2)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.machine import autocal
from moeslots.engine.native import replay
from moeslots.engine.native import routing_stats as stats_mod
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.native.tier import NativeTier

HEADER = ("| threads | slots | what | wall ms | CPU splits | CPU wait | CPU copy | CPU compute | GPU splits | "
          "GPU wait | GPU copy | GPU launch | rest | per layer: CPU wait+copy µs | CPU compute µs |")


def timed(ctx: Context, toks: list[int]) -> dict[str, float]:
    """Decode `toks` one by one under the scheduler's clock: ms per token per field, wall and rest."""
    stats_mod.sched_timing(True)
    t0 = time.perf_counter()
    for t in toks:
        ctx.decode([t])
    wall = (time.perf_counter() - t0) * 1e3 / len(toks)
    t = stats_mod.sched_timing(False)
    assert t is not None, "this engine has no scheduler clock (patch 0006)"
    d = {k: v * t.graphs / len(toks) for k, v in t.per_graph_ms().items()}
    d["wall_ms"] = wall
    d["rest_ms"] = wall - sum(v for k, v in d.items() if k.endswith("_ms") and k != "wall_ms")
    return d


def row(threads: int, slots: int, what: str, d: dict[str, float], layers: int) -> str:
    def per(ms: float) -> float:
        return 1e3 * ms / layers

    return (f"| {threads} | {slots} | {what} | {d['wall_ms']:.2f} | {d['cpu_splits']:.0f} | {d['cpu_wait_ms']:.2f} | "
            f"{d['cpu_copy_ms']:.2f} | {d['cpu_compute_ms']:.2f} | {d['gpu_splits']:.0f} | {d['gpu_wait_ms']:.2f} | "
            f"{d['gpu_copy_ms']:.2f} | {d['gpu_launch_ms']:.2f} | {d['rest_ms']:.2f} | "
            f"{per(d['cpu_wait_ms'] + d['cpu_copy_ms']):.0f} | {per(d['cpu_compute_ms']):.0f} |")


def main() -> None:
    path = Path(sys.argv[1])
    thread_counts = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "16,6").split(",")]
    slots_arg = sys.argv[3] if len(sys.argv) > 3 else "64,32"
    slot_counts = [] if slots_arg == "-" else [int(x) for x in slots_arg.split(",")]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 48
    n_cal = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    if n_cal < 1 and slot_counts:
        sys.exit("the trace splits fetch-split by a calibration of this machine: CALIBRATIONS must be at least 1")
    with Model(path, LoadOptions(experts_on_host=True, use_mmap=False)) as m:
        f = m.facts
        moe = [il for il in f.moe_layers if il < f.n_layer]
        toks = [int(x) for x in np.random.default_rng(0).integers(0, m.n_vocab - 16, n + 16)]
        for threads in thread_counts:
            cals = []
            for i in range(n_cal):
                c = autocal.run(m, threads=threads, slots=max(slot_counts or [64]), pack_host=False,
                                log=lambda s: None)
                cals.append(c)
                print(f"calibration {i + 1} at {threads} threads ({c.seconds:.1f} s): CPU {c.cpu_gbps:.1f} GB/s, "
                      f"base {c.base_ms:.2f} ms, fetch {c.fetch_gbps:.1f} GB/s + {c.fetch_base_ms:.2f} ms, share "
                      f"{1e3 * c.share_ms:.0f} µs/layer, share CPU {c.share_cpu_gbps:.1f} GB/s, beside "
                      f"{1e3 * c.share_overlap_ms:.0f} µs/layer of the GPU's work ({c.method})",
                      flush=True)
                for line in c.raw:
                    if " routing: " in line:
                        print(f"  {line}", flush=True)
            if not slot_counts:
                continue
            cost = cals[-1].cost_model(f.slab_bytes / 1e6, pinned=True, threads=threads)
            print(HEADER + "\n" + "|---" * 15 + "|", flush=True)
            with Context(m, n_ctx=n + 64, threads=threads) as ctx:
                replay.set_replay(ctx.ptr, replay.uniform(4096, len(moe), f.n_expert, f.n_expert_used, seed=4))

                def run(S: int, what: str) -> None:
                    m.set_slots(SlotPlan({il: tuple(range(S)) for il in moe}), pack_host=False)
                    ctx.reset()
                    ctx.decode(toks[:8], prompt=True)
                    tier = None
                    if what != "static":
                        device = what.startswith("fetch")
                        tier = NativeTier(m.ptr, SlotPlan({il: tuple(range(S)) for il in moe}), S // 2, cost,
                                          device=device, share=what == "fetch-split")
                    try:
                        ctx.decode(toks[8:12])                 # warm: the decode graph built
                        d = timed(ctx, toks[12:12 + n])
                    finally:
                        if tier is not None:
                            tier.close()
                    print(row(threads, S, what, d, len(moe)), flush=True)

                for S in slot_counts:
                    for what in ("static", "fetch-split", "static", "fetch", "static", "hybrid", "static"):
                        run(S, what)
                    for what in ("fetch", "static", "fetch-split", "static", "static"):   # the other order
                        run(S, what)
                run(0, "static")                                   # every expert on the CPU
                run(f.n_expert, "static")                          # every expert in VRAM: the GPU's own token
                replay.set_replay(ctx.ptr, None)


if __name__ == "__main__":
    main()
