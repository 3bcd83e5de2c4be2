"""What the CPU share's worker (patch 0010) buys a GPU-stepped tier: one-token decodes of a model with its experts
pinned, every slot a tier (`--policy fetch-split`'s best split on the GPU box), under replayed uniform routing, in
four ways taking turns: fetch (every miss copied by the GPU, the CPU idle), fetch-split as the graph splits it (the
CPU's split a layer, the scheduler between), and fetch-split with the worker at THREADS and at THREADS - 1 threads
(the host thread that drives the GPU keeps a core). Per way the median ms a token over ROUNDS rounds of N decodes,
the CPU's picks and the uploads a token (the worker must leave the split as it was: the same rule, the same costs),
and the worker's layer shares, with its time a share (waiting for the stage, computing). The split's costs are the
fourth harness run's calibration (CPU 60.3 GB/s at 16 threads, 33 at 6; the link 52.4 GB/s) unless --cpu-gbps and
--link-gbps are given: the same for every way.
Without a GPU the pack stays in host memory and every way runs on the CPU (a check that the script runs).
Usage: python3 -P scripts/h200/worker_speed.py MODEL.gguf [THREADS,...] [SLOTS,...] [ROUNDS] [N]
       [--cpu-gbps=X] [--link-gbps=Y]"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.machine.fetch_rates import decode_ms
from moeslots.engine.native import lib as native
from moeslots.engine.native import replay
from moeslots.engine.native import tier as native_tier
from moeslots.engine.native.expert_cache import CacheError, SlotPlan
from moeslots.profiles.costs import CostModel

CPU_GBPS = {16: 60.3, 6: 33.0}      # the fourth harness run's calibration (docs/lab/2026-12-07-h100-defaults-fourth.md)
LINK_GBPS = 52.4


def _arg(name: str) -> float | None:
    for a in sys.argv[1:]:
        if a.startswith(f"--{name}="):
            return float(a.split("=", 1)[1])
    return None


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args:
        sys.exit(__doc__)
    try:
        threads = [int(x) for x in (args[1] if len(args) > 1 else "16,6").split(",")]
        slots = [int(x) for x in (args[2] if len(args) > 2 else "32,64").split(",")]
        rounds = int(args[3]) if len(args) > 3 else 3
        n = int(args[4]) if len(args) > 4 else 48
        cpu_arg, link = _arg("cpu-gbps"), _arg("link-gbps") or LINK_GBPS
    except ValueError as e:
        sys.exit(f"worker_speed.py: {e} (THREADS, SLOTS: comma-separated counts; ROUNDS, N: numbers)")
    if min(threads) < 1 or min(slots) < 1 or rounds < 1 or n < 4:
        sys.exit("worker_speed.py: THREADS, SLOTS and ROUNDS must be positive, N at least 4")
    pack_host = not native.gpus()
    t0 = time.perf_counter()
    with Model(Path(args[0]), LoadOptions(experts_on_host=True, use_mmap=False)) as m:
        f = m.facts
        moe = [il for il in f.moe_layers if il < f.n_layer]
        print(f"model loaded in {time.perf_counter() - t0:.1f} s (pinned{', no GPU' if pack_host else ''}); "
              f"{len(moe)} MoE layers, {f.n_expert} experts, k {f.n_expert_used}", flush=True)
        table = replay.uniform(4096, len(moe), f.n_expert, f.n_expert_used, seed=3)
        toks = [int(t) for t in np.random.default_rng(0).integers(0, m.n_vocab - 16, n + 16)]
        print("| threads | slots | way | ms/token (median) | rounds' ms | CPU picks/token | uploads/token | "
              "worker shares/token | us waiting/share | us computing/share |\n" + "|---" * 10 + "|", flush=True)
        for T in threads:
            cpu = cpu_arg or CPU_GBPS.get(T, CPU_GBPS[16] * T / 16)
            cost = CostModel(slab_mb=f.slab_bytes / 1e6, cpu_gbps=cpu, pcie_gbps=link, gpu_gbps=1000.0, base_ms=5.0,
                             fetch_gbps=link)
            ways = {"fetch": (False, 0), "fetch-split, graph": (True, 0), f"fetch-split, worker {T}": (True, T)}
            if T > 1:
                ways[f"fetch-split, worker {T - 1}"] = (True, T - 1)
            with Context(m, n_ctx=n + 64, threads=T) as ctx:
                replay.set_replay(ctx.ptr, table)
                for S in slots:
                    S = max(f.n_expert_used, min(S, f.n_expert - 1))
                    plan = SlotPlan.uniform(moe, S, f.n_expert, offset=17)
                    got: dict[str, list[tuple[float, ...]]] = {w: [] for w in ways}
                    for r in range(rounds):
                        order = list(ways) if r % 2 == 0 else list(reversed(ways))     # taking turns: drift cancels
                        for w in order:
                            share, worker = ways[w]
                            got[w].append(_one(m, ctx, plan, S, cost, share, worker, toks, pack_host))
                    for w, rows in got.items():
                        ms = [x[0] for x in rows]
                        print(f"| {T} | {S} | {w} | {statistics.median(ms):.2f} | "
                              f"{', '.join(f'{x:.2f}' for x in ms)} | {statistics.median(x[1] for x in rows):.1f} | "
                              f"{statistics.median(x[2] for x in rows):.1f} | "
                              f"{statistics.median(x[3] for x in rows):.1f} | "
                              f"{statistics.median(x[4] for x in rows):.1f} | "
                              f"{statistics.median(x[5] for x in rows):.1f} |", flush=True)


def _one(m: Model, ctx: Context, plan: SlotPlan, S: int, cost: CostModel, share: bool, worker: int,
         toks: list[int], pack_host: bool) -> tuple[float, float, float, float, float, float]:
    """(median ms a token, CPU picks, uploads and worker shares a token, the worker's us waiting for a stage and
    computing a share) of len(toks) - 16 one-token decodes."""
    m.set_slots(plan, pack_host=pack_host)
    ctx.reset()
    ctx.decode(toks[:8], prompt=True)
    try:
        t = native_tier.NativeTier(m.ptr, plan, S, cost, device=True, share=share, worker=worker)
    except CacheError as e:
        sys.exit(f"worker_speed.py: {e}")
    try:
        for tok in toks[8:16]:                      # the graphs, and the tier warm
            ctx.decode([tok])
        t.step(force=True)
        t.counts = native_tier.TierCounts()
        native_tier.worker_stats(m.ptr, reset=True)
        ms = decode_ms(ctx, toks[16:])
        t.step(force=True)
        w = native_tier.worker_stats(m.ptr) or native_tier.WorkerStats()
    finally:
        t.close()
    k = len(toks) - 16
    wait_us, work_us = w.per_share()
    return ms, t.counts.cpu / k, t.counts.uploads / k, w.shares / k, wait_us, work_us


if __name__ == "__main__":
    main()
