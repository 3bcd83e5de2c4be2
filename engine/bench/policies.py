"""`moeslots bench repick`: adaptive residency measured: static vs re-pick every N tokens (and live `--repick auto`)
under replayed routing, beside the simulator's prediction for the same rows and rule."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ...profiles import repick as chooser
from ...profiles.costs import CostModel
from ...profiles.plan import plan_from_counts
from ...profiles.repick import Picks
from ...profiles.simulate import layer_counts, reelect, resident_from_plan, run_schedule, static_hits
from ..llm.model import Context, LoadOptions, Model, default_threads
from ..machine import calibrate
from ..native import expert_cache as cache
from ..native import replay, routing_stats
from ..native.expert_cache import SlotPlan
from ..runtime.residency import AUTO_EVERY


@dataclasses.dataclass
class RepickRow:
    routing: str
    slots: int
    every: int                       # 0: static
    decode_tok_s: float
    ms_per_token_median: float
    hit_rate: float
    mb_moved_per_token: float
    swaps: int
    scheduler_mb_per_token: float    # weights the scheduler copied (must stay 0)
    sim_hit_rate: float
    sim_mb_per_token: float
    sim_ms_per_token: float
    decisions: str = ""              # live auto (every == AUTO): "token:interval" at each switch, from token 0


AUTO = -1                            # run_repick's interval for live `--repick auto`


def run_repick(model_path: Path, slot_counts: Sequence[int], intervals: Sequence[int], routings: Sequence[str], *,
               n_decode: int = 256, profile_rows: int = 1024, threads: int | None = None, mmap: bool = True,
               pack_host: bool = False, max_swaps: int = 4, window: int = 64, margin: float = 0.25,
               cost: CostModel | None = None, overlap: bool = False, auto_every: int | None = None,
               profile_from: str | None = None,
               log: Callable[[str], None] = print) -> tuple[list[RepickRow], dict]:
    """For each routing (a trace CSV, or "uniform"), replayed through the router: the static plan is the top-S of
    the first `profile_rows` rows (the profile); the timed decode replays the rows after them. Re-picks run
    between decode steps exactly as in the engine (cache.repick), their copies inside the timed step; with
    overlap=True they are staged on a worker thread and committed between steps (cache.Stager, as the engine does),
    so a re-pick's swaps arrive over the next tokens. The simulator runs the same rows with the same rule
    (profiles.simulate.reelect; it applies swaps at once) under `cost` (default: this machine's,
    engine.calibrate.costs_for). Interval AUTO is live `--repick auto`:
    the interval chosen at load from the profile rows (choose_repick), then chosen again every `auto_every` tokens
    on the rows just decoded, from the plan held when they began (choose_repick_from, untimed, as the engine does
    it between replies); the simulator runs the same schedule. `profile_from` (a trace CSV): the profile rows come
    from that trace instead of the replayed one — a chat that is not what its profile recorded."""
    auto_every = auto_every or AUTO_EVERY
    for every in intervals:
        if every >= n_decode:
            log(f"note: re-pick {every} never fires in {n_decode} decode tokens (its row measures static again); "
                f"-n {2 * every} or more measures it")
    m = Model(model_path, LoadOptions(experts_on_host=True, use_mmap=mmap, extra_bufts=not pack_host))
    f = m.facts
    moe = [il for il in f.moe_layers if il < f.n_layer]
    slab_mb = f.slab_bytes / 1e6
    cost = cost or calibrate.costs_for(f.slab_bytes, pinned=not mmap, threads=threads or default_threads())[0]
    ctx = Context(m, n_ctx=n_decode + 64, threads=threads)
    ctx.enable_stats(ring_rows=(window + 8) * (len(moe) + 2))
    rng = np.random.default_rng(0)
    toks = [int(t) for t in rng.integers(0, m.n_vocab - 16, n_decode + 16)]
    info: dict[str, Any] = {
        "model": str(model_path), "n_layer": f.n_layer, "n_expert": f.n_expert, "k": f.n_expert_used,
        "n_moe": len(moe), "mmap": mmap, "threads": threads, "n_decode": n_decode, "profile_rows": profile_rows,
        "max_swaps": max_swaps, "window": window, "margin": margin, "cost": dataclasses.asdict(cost),
        "profile_from": profile_from, "routings": {}}
    rows: list[RepickRow] = []
    stager: "cache.Stager | None" = None
    try:
        for routing in routings:
            full = (replay.uniform(profile_rows + n_decode + 16, len(moe), f.n_expert, f.n_expert_used, seed=7)
                    if routing == "uniform" else replay.from_trace(Path(routing), f.n_expert, f.n_expert_used))
            need = profile_rows + n_decode + 16
            if full.n_rows < need:
                raise ValueError(f"{routing}: {full.n_rows} decode rows, the benchmark needs {need}")
            picks = full.per_layer(moe)                                    # [rows, L, k] per model MoE layer
            prof = picks[:profile_rows]
            if profile_from:
                other = replay.from_trace(Path(profile_from), f.n_expert, f.n_expert_used)
                if other.n_rows < profile_rows or other.ids.shape[1] != full.ids.shape[1]:
                    raise ValueError(f"{profile_from}: needs {profile_rows} rows of {full.ids.shape[1]} layers, has "
                                     f"{other.n_rows} of {other.ids.shape[1]}")
                prof = other.per_layer(moe)[:profile_rows]
            test = full.ids[profile_rows:profile_rows + n_decode + 16]
            replay.set_replay(ctx.ptr, replay.ReplayTable(test, full.source))
            name = "uniform" if routing == "uniform" else Path(routing).stem
            if profile_from:
                name += f" (profile: {Path(profile_from).stem})"
            info["routings"][name] = full.source
            counts = layer_counts(prof, moe, f.n_expert)
            P = picks[profile_rows + 16:profile_rows + 16 + n_decode]     # the timed decode rows
            for s in slot_counts:
                plan0 = SlotPlan(plan_from_counts(counts, s, moe))
                initial = resident_from_plan(dict(plan0.layers), moe, f.n_expert)
                m.set_slots(plan0, pack_host=pack_host, spare=overlap)  # one full upload per slot count
                if stager is not None:
                    stager.close()
                stager = cache.Stager(m.ptr) if overlap else None
                plan = plan0
                for every in intervals:
                    _restore(m, plan, plan0, pack_host, overlap)         # undo the last policy's swaps only
                    plan = plan0
                    cur = (chooser.choose_repick(Picks(prof, moe, f.n_expert), s, cost, max_swaps=max_swaps,
                                         margin=margin)[0] if every == AUTO else every)
                    sched_of, held = [(0, cur)], plan0
                    ctx.reset()
                    ctx.decode(toks[:12], prompt=True)                     # rows 0..11: prompt
                    for t in toks[12:16]:                                 # rows 12..15: graphs, ring warm
                        ctx.decode([t])
                    routing_stats.reset(ctx.ptr)
                    b0 = routing_stats.weight_copy_bytes()
                    per, moved, swaps, since = [], 0, 0, 0
                    for i, t in enumerate(toks[16:16 + n_decode], 1):
                        t1 = time.perf_counter()
                        ctx.decode([t])
                        since += 1
                        if stager is not None:
                            plan, n_sw, n_b = stager.poll(plan)
                            swaps, moved = swaps + n_sw, moved + n_b
                        if cur and since >= cur:
                            since = 0
                            if stager is None:
                                plan, n_sw, n_b = cache.repick(m.ptr, plan, ctx.read_stats().ring, f.n_expert,
                                                               max_swaps=max_swaps, window=window, margin=margin)
                                swaps, moved = swaps + n_sw, moved + n_b
                            elif not stager.busy:
                                stager.begin(cache.elect_swaps(plan, ctx.read_stats().ring, f.n_expert,
                                                               max_swaps=max_swaps, window=window, margin=margin))
                        per.append(time.perf_counter() - t1)
                        if every == AUTO and i % auto_every == 0 and i < n_decode:
                            n2 = chooser.choose_repick_from(Picks(P[:i], moe, f.n_expert), dict(held.layers), cost,
                                                    last=auto_every, current=cur, max_swaps=max_swaps,
                                                    margin=margin)[0]
                            if n2 != cur:
                                cur, since = n2, 0
                                sched_of.append((i, n2))
                            held = plan
                    if stager is not None:
                        stager.drain()                             # copies still in flight are dropped
                    st = ctx.read_stats()
                    sched = routing_stats.weight_copy_bytes() - b0
                    if every == AUTO:
                        shr, sup = run_schedule(P, 0, initial, s, sched_of, window, max_swaps, margin)
                    elif every:
                        shr, sup = reelect(P, s, f.n_expert, every, window, initial,
                                            max_swaps=max_swaps, margin=margin)
                    else:
                        shr, sup = static_hits(P, initial)[0], 0.0
                    L, k = P.shape[1], P.shape[2]
                    cpu = (1 - shr) * L * k
                    row = RepickRow(name, s, every, len(per) / sum(per), 1000 * statistics.median(per), st.hit_rate,
                                    moved / len(per) / 1e6, swaps, sched / len(per) / 1e6, shr,
                                    sup * slab_mb, cost.ms_per_token(L * k - cpu, cpu, sup),
                                    " ".join(f"{t}:{n}" for t, n in sched_of) if every == AUTO else "")
                    rows.append(row)
                    log(render_repick_row(row))
    finally:
        if stager is not None:
            stager.close()
        replay.set_replay(ctx.ptr, None)
        ctx.close()
        m.close()
    return rows, info


def _restore(m: Model, plan: SlotPlan, plan0: SlotPlan, pack_host: bool, spare: bool = False) -> None:
    """Put plan0's experts back into the slots a re-pick changed (the pack stays allocated); when an expert has to
    come back from another slot (swap cannot move a resident expert), reconfigure instead."""
    if plan is plan0:
        return
    for il, slots in plan.layers.items():
        want = plan0.layers[il]
        if any(want[j] in slots for j in range(len(slots)) if slots[j] != want[j]):
            m.set_slots(plan0, pack_host=pack_host, spare=spare)
            return
    for il, slots in plan.layers.items():
        for slot, (e, e0) in enumerate(zip(slots, plan0.layers[il])):
            if e != e0:
                cache.swap(m.ptr, il, slot, e0)


REPICK_HEADER = ("| routing | slots | policy | tok/s | ms/token | hit % | MB moved/token | swaps | sim hit % | "
                 "sim MB/token | sim ms/token |\n|---|---|---|---|---|---|---|---|---|---|---|")


def render_repick_row(r: RepickRow) -> str:
    pol = ("static" if r.every == 0 else f"auto ({r.decisions})" if r.every == AUTO else f"re-pick {r.every}")
    return (f"| {r.routing} | {r.slots} | {pol} | {r.decode_tok_s:.1f} | {r.ms_per_token_median:.2f} | "
            f"{100 * r.hit_rate:.1f} | {r.mb_moved_per_token:.2f} | {r.swaps} | {100 * r.sim_hit_rate:.1f} | "
            f"{r.sim_mb_per_token:.2f} | {r.sim_ms_per_token:.2f} |")
