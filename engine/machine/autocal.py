"""The first-run calibration: what `--policy auto` needs to choose for this machine, measured by itself the first
time a model shape runs here at a thread count and with its experts in a kind of memory (pinned or pageable), on
the model the engine has loaded, before the first plan goes in. `moeslots doctor --calibrate` stays the full run
(every thread count, both kinds of memory, prompts).

What it measures, each with the engine under uniform replayed routing in a small context of its own:
1. the CPU expert rate and the token's base at the engine's thread count: static at S slots with routing that misses
   the slots and routing that hits them, three pairs in turn, the CPU's compute by the scheduler's clock
   (engine.cpu_rate);
2. re-pick and tier uploads from the memory the experts live in (engine.calibrate.upload_gbps);
3. the host tier's route node per layer (engine.route_cost);
4. with the experts pinned and a GPU: the GPU-stepped tier's reading rate, its fixed part, its CPU share's cost per
   layer and what the share runs beside (engine.fetch_rates).
Mapped experts are read once first (every expert, no slots): their pages would otherwise come in during the first
measurement. Without a GPU only the first can be measured (a lower bound: both chains run on the CPU), and the record
says what it skipped. Stored in config.toml under the machine, shape, threads and memory (engine.calibrate.entry_key).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ...profiles.costs import CostModel
from ..llm.facts import ModelFacts
from ..llm.model import Context, Model
from ..native import lib as native
from ..native import replay
from ..native.expert_cache import SlotPlan
from . import calibrate
from .calibrate import Calibration
from .cpu_rate import cpu_rate
from .fetch_rates import FetchCosts, fetch_rates
from .route_cost import route_cost

N_TOKENS = 16           # timed one-token decodes per measurement
STEPS = 4


def _touch_experts(m: Model, ctx: Context, moe: list[int], pack_host: bool) -> None:
    """Read every expert once with no slots (replayed rows that cover each layer's experts): mapped experts are
    paged in by their first read, which would otherwise land in the first measurement and make the CPU look slow."""
    f = m.facts
    k, E = f.n_expert_used, f.n_expert
    rows = -(-E // k)
    ids = (np.arange(rows * k).reshape(rows, 1, k) % E).repeat(len(moe), axis=1).astype(np.int32)
    m.set_slots(SlotPlan({}), pack_host=pack_host)
    replay.set_replay(ctx.ptr, replay.ReplayTable(ids, "every expert once"))
    try:
        ctx.reset()
        for t in range(rows):
            ctx.decode([t % (m.n_vocab - 1)], prompt=t == 0)
    finally:
        replay.set_replay(ctx.ptr, None)
        ctx.reset()


def shape_of(f: ModelFacts) -> str:
    """The model shape a calibration is kept for: what its costs depend on (arch, layers, experts, slab bytes)."""
    moe = len([il for il in f.moe_layers if il < f.n_layer])
    return f"{f.arch} {moe} MoE layers x {f.n_expert} experts ({f.n_expert_used} used) x {f.slab_bytes} B"


def memory_of(m: Model) -> str:
    return "pageable" if m.opts.use_mmap else "pinned"


def stored(m: Model, threads: int) -> Calibration | None:
    """This machine's first-run calibration for this model's shape at `threads` and memory, if there is one that is
    current: one from before version 2 (a fetch-split share fitted on the token's sums, which predicted fetch-split
    2-14 % slow on the H100 box; no host tier's route) counts as none, so the next session measures it again."""
    c = calibrate.load(shape=shape_of(m.facts), threads=threads, pinned=not m.opts.use_mmap)
    if c is None or c.kind != "first-run" or c.version < calibrate.VERSION:
        return None
    return c


def run(m: Model, *, threads: int, slots: int, pack_host: bool, log: Callable[[str], None],
        n_tokens: int = N_TOKENS) -> Calibration:
    """Measure, store and return the first-run calibration of this model (see the module's text). slots: the slots
    per layer to measure at (capped at half the experts; what the plan about to go in holds, so it fits)."""
    f = m.facts
    moe = [il for il in f.moe_layers if il < f.n_layer]
    S = max(f.n_expert_used, min(slots, f.n_expert // 2))
    pinned = not m.opts.use_mmap
    gpu = not pack_host and bool(native.gpus())
    t0 = time.perf_counter()
    raw: list[str] = []
    skipped: list[str] = []

    def say(line: str) -> None:
        raw.append(line)
        log(f"  {line}")

    n_steps = STEPS if gpu and pinned else STEPS - 1
    log(f"calibrating for --policy auto (the first run of this model shape here, {threads} threads, "
        f"{memory_of(m)} experts; about {10 if not pinned else 17} s with a GPU)")
    with Context(m, n_ctx=max(n_tokens, f.n_expert // max(1, f.n_expert_used)) + 16, n_batch=16,
                 threads=threads) as ctx:
        if not pinned:
            _touch_experts(m, ctx, moe, pack_host)
        log(f"1/{n_steps} the CPU's expert rate at {threads} threads")
        cpu, base, method = cpu_rate(m, moe, threads, n_tokens, S, pack_host, say, ctx=ctx)
        log(f"2/{n_steps} uploads from {memory_of(m)} memory")
        up, up_1 = calibrate.upload_gbps(m, moe, f.n_expert, pack_host, rounds=2)
        say(f"uploads: {up:.2f} GB/s batched, {up_1:.2f} GB/s one at a time"
            + (" (host-to-host copies: no GPU)" if pack_host else ""))
        log(f"3/{n_steps} the host tier's route (--policy hybrid, dynamic) at {S} slots")
        rc = route_cost(m, moe, S, threads, n_tokens, pack_host, say, ctx=ctx)
        fc = FetchCosts()
        if gpu and pinned:
            log(f"4/{n_steps} the GPU-stepped tier (--policy fetch, fetch-split) at {S} and {S // 2} slots")
            fc = fetch_rates(m, moe, S, threads, n_tokens, False, say,
                             CostModel(slab_mb=f.slab_bytes / 1e6, cpu_gbps=cpu or CostModel.cpu_gbps, base_ms=base),
                             ctx=ctx)
    if not gpu:
        skipped.append("uploads over PCIe and the GPU-stepped tier (no GPU holds slots: the uploads measured are "
                       "host copies, the CPU rate a lower bound)")
    elif not pinned:
        skipped.append("the GPU-stepped tier (--policy fetch, fetch-split: it reads pinned memory, and these "
                       "experts are mmap'ed)")
    elif not fc.gbps:
        skipped.append("the GPU-stepped tier (this device did not step it)")
    elif not fc.share_ms:
        skipped.append("the GPU-stepped tier's CPU share (--policy fetch-split)")
    secs = time.perf_counter() - t0
    c = Calibration(machine=calibrate.machine_id(), date=time.strftime("%Y-%m-%d"), model=f.name,
                    slab_mb=f.slab_bytes / 1e6,
                    upload_pageable_gbps=up if gpu and not pinned else 0.0,
                    upload_pinned_gbps=up if gpu and pinned else 0.0,
                    upload_pageable_single_gbps=up_1 if gpu and not pinned else 0.0,
                    upload_pinned_single_gbps=up_1 if gpu and pinned else 0.0,
                    host_copy_gbps=up if not gpu else 0.0,
                    cpu_gbps=cpu, base_ms=base, method=method, threads=threads, cpu_threads=(threads,),
                    cpu_gbps_threads=(round(cpu, 3),), base_ms_threads=(round(base, 4),),
                    fetch_gbps=fc.gbps, share_ms=fc.share_ms, fetch_base_ms=fc.base_ms,
                    share_cpu_gbps=fc.share_cpu_gbps, share_overlap_ms=fc.share_overlap_ms, route_ms=rc.route_ms,
                    unmeasured="; ".join(skipped), kind="first-run", version=calibrate.VERSION,
                    shape=shape_of(m.facts), memory=memory_of(m), seconds=round(secs, 2), raw=tuple(raw))
    try:
        calibrate.save(c)
        where = "saved"
    except (OSError, ValueError) as e:
        where = f"not saved ({e}): measured again next time"
    log(f"calibrated in {secs:.1f} s, {where}" + (f"; skipped: {c.unmeasured}" if skipped else ""))
    return c
