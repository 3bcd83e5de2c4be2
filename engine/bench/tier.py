"""`moeslots bench repick --policy hybrid,dynamic,auto`: the dynamic tier measured (engine.native_tier: each token's
misses split between the CPU and uploads into the tier now, by this machine's costs) under replayed routing, beside
the simulator's prediction for the same rows, core, rule and costs (profiles.hybrid with the ENGINE mechanism)."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ...profiles.costs import CostModel
from ...profiles.hybrid import ENGINE, FETCH, FETCH_SPLIT, simulate_hybrid
from ...profiles.plan import plan_from_counts
from ...profiles.policy import GPU_STEPPED, Decision, decide_policy, tier_slots
from ...profiles.repick import Picks
from ...profiles.simulate import layer_counts
from ..llm.model import Context, LoadOptions, Model, default_threads
from ..machine import autocal, calibrate
from ..native import lib as native
from ..native import replay, routing_stats
from ..native.expert_cache import SlotPlan
from ..native.tier import NativeTier, TierCounts, masks
from ..runtime.autocheck import AutoCheck

SETTLED = "default, settled"     # the default after auto's self-check (engine.autocheck), as the app has it


@dataclasses.dataclass
class TierRow:
    routing: str
    slots: int
    policy: str                      # as asked (auto: what it chose follows in `chosen`)
    tier: int                        # dynamic slots per layer
    decode_tok_s: float
    ms_per_token_median: float
    hit_rate: float                  # native stats: picks served by the pack (core + tier)
    tier_hits_per_token: float
    cpu_per_token: float
    uploads_per_token: float         # misses uploaded into the tier (and computed on the GPU) per token
    mb_per_token: float
    sim_hit_rate: float
    sim_uploads_per_token: float
    sim_cpu_per_token: float
    sim_ms_per_token: float
    chosen: str = ""                 # auto: its one-line reason
    reps: int = 1                    # measurements of this row (interleaved with the other policies'): decode_tok_s
    tok_s_min: float = 0.0           # and ms_per_token_median are their medians, these their range
    tok_s_max: float = 0.0
    rep_ms: tuple[float, ...] = ()   # each measurement's ms per token (its median), in the order they ran


def run_tiers(model_path: Path, slot_counts: Sequence[int], policies: Sequence[str], routings: Sequence[str], *,
              tier: int | None = None, n_decode: int = 128, profile_rows: int = 1024, threads: int | None = None,
              mmap: bool = True, pack_host: bool = False, cost: CostModel | None = None, reps: int = 1,
              log: Callable[[str], None] = print, used: dict[str, object] | None = None) -> list[TierRow]:
    """For each routing (a trace CSV or "uniform") replayed through the router: the plan of S slots is the top-S of
    the first `profile_rows` rows; its last D slots are the tier; the timed decode replays the rows after them, the
    engine's tier deciding every token's uploads. The simulator runs the same rows from the same core, tier and
    costs. reps > 1: each policy's row is measured reps times, the policies taking turns in alternating order (a
    drift of the machine's speed over the run then reaches every policy alike); the row is the median, with the
    range. "default" also gives a row SETTLED: the runner-up measured where auto's self-check would try it (a choice
    slower than predicted, or a near tie), and the faster of the two, as the app settles after its first replies.
    used: filled with the costs that predicted the rows (their dict, where they came from, the calibration's raw
    lines), for `bench repick --json`."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, not {reps}")
    m = Model(model_path, LoadOptions(experts_on_host=True, use_mmap=mmap, extra_bufts=not pack_host))
    f = m.facts
    moe = [il for il in f.moe_layers if il < f.n_layer]
    T = threads or default_threads()
    gpu = not pack_host and bool(native.gpus())
    if "default" in policies and gpu and autocal.stored(m, T) is None:     # what a new user's first session does
        autocal.run(m, threads=T, slots=max(slot_counts), pack_host=pack_host, log=log)
        cost = None                                                         # ...and the costs it then has
    source = "given"
    if cost is None:
        cost, source = calibrate.costs_for(f.slab_bytes, pinned=not mmap, threads=T, shape=autocal.shape_of(f))
    cal = calibrate.load(shape=autocal.shape_of(f), threads=T, pinned=not mmap)   # the one the costs come from
    if used is not None:                # what predicted the rows, to explain them later
        used.update(cost=dataclasses.asdict(cost), source=source, calibration=list(cal.raw) if cal else [])
    ctx = Context(m, n_ctx=n_decode + 64, threads=threads)
    ctx.enable_stats(ring_rows=64 * (len(moe) + 2))
    toks = [int(t) for t in np.random.default_rng(0).integers(0, m.n_vocab - 16, n_decode + 16)]
    rows: list[TierRow] = []
    try:
        for routing in routings:
            full = (replay.uniform(profile_rows + n_decode + 16, len(moe), f.n_expert, f.n_expert_used, seed=7)
                    if routing == "uniform" else replay.from_trace(Path(routing), f.n_expert, f.n_expert_used))
            if full.n_rows < profile_rows + n_decode + 16:
                raise ValueError(f"{routing}: {full.n_rows} decode rows, the benchmark needs "
                                 f"{profile_rows + n_decode + 16}")
            picks = full.per_layer(moe)
            prof = picks[:profile_rows]
            replay.set_replay(ctx.ptr, replay.ReplayTable(full.ids[profile_rows:profile_rows + n_decode + 16],
                                                          full.source))
            name = "uniform" if routing == "uniform" else Path(routing).stem
            counts = layer_counts(prof, moe, f.n_expert)
            W = picks[profile_rows + 12:profile_rows + 16]                # the warm-up decode rows (graphs)
            P = picks[profile_rows + 16:profile_rows + 16 + n_decode]     # the timed decode rows
            for s in slot_counts:
                plan = SlotPlan(plan_from_counts(counts, s, moe))
                tiers: dict[str, tuple[int, str, str]] = {}    # policy -> (tier, why, GPU-stepped kind or "")
                decision: Decision | None = None
                for pol in policies:
                    if pol == "default" and not gpu:                  # no GPU holds the slots: static
                        chosen, d, why = "static", 0, "static (the default without a GPU)"
                    elif pol in ("auto", "default"):
                        decision = decide_policy(Picks(prof, moe, f.n_expert), s, cost, fetch=not (pack_host or mmap),
                                                 share=cal is not None and cal.share_ms > 0)
                        chosen, d, why = decision.policy, decision.tier, decision.why
                    else:
                        chosen, d, why = pol, tier_slots(pol, s, tier, used=f.n_expert_used), ""
                    tiers[pol] = (d, why, chosen if chosen in GPU_STEPPED else "")
                runs: dict[str, list[TierRow]] = {pol: [] for pol in policies}
                for rep in range(reps):
                    for pol in (policies if rep % 2 == 0 else list(reversed(policies))):
                        runs[pol].append(_one(m, ctx, plan, tiers[pol][0], cost, toks, W, P, pack_host=pack_host,
                                              gpu=tiers[pol][2]))
                for pol in policies:
                    row = dataclasses.replace(_median(runs[pol]), routing=name, policy=pol, chosen=tiers[pol][1])
                    rows.append(row)
                    log(render_tier_row(row))
                    if pol == "default" and gpu and decision is not None:
                        settled = _settle(decision, row, lambda p, d: _median([_one(
                            m, ctx, plan, d, cost, toks, W, P, pack_host=pack_host,
                            gpu=p if p in GPU_STEPPED else "") for _ in range(reps)]))
                        rows.append(dataclasses.replace(settled, routing=name))
                        log(render_tier_row(rows[-1]))
    finally:
        replay.set_replay(ctx.ptr, None)
        ctx.close()
        m.close()
    return rows


def _settle(decision: Decision, first: TierRow, measure: Callable[[str, int], TierRow]) -> TierRow:
    """auto's self-check on the default's measured row: where it would try the runner-up, that is measured too
    (measure(policy, tier)), and the row kept is the one the check keeps; its `chosen` says what the check did."""
    check = AutoCheck(decision, tokens=1)
    n = 64                                          # tokens per trial: the check compares ms/token, not totals
    keep = first
    to = check.timed(n, n * first.ms_per_token_median / 1e3)
    if to is not None:
        second = measure(*to)
        back = check.timed(n, n * second.ms_per_token_median / 1e3)
        keep = first if back is not None else dataclasses.replace(second, chosen="")
    return dataclasses.replace(keep, policy=SETTLED, chosen=check.line or "the check kept the choice")


def _median(rows: list[TierRow]) -> TierRow:
    """One row from repeated measurements of one configuration: the counts are the same every time (the same rows,
    the same rule), the speed is the median, with its range."""
    tok = [r.decode_tok_s for r in rows]
    return dataclasses.replace(rows[0], decode_tok_s=statistics.median(tok),
                               ms_per_token_median=statistics.median(r.ms_per_token_median for r in rows),
                               reps=len(rows), tok_s_min=min(tok), tok_s_max=max(tok),
                               rep_ms=tuple(r.ms_per_token_median for r in rows))


def _one(m: Model, ctx: Context, plan: SlotPlan, d: int, cost: CostModel, toks: list[int], W: np.ndarray,
         P: np.ndarray, *, pack_host: bool, gpu: str = "") -> TierRow:
    """One configuration timed; gpu: the GPU-stepped tier's policy (fetch, fetch-split) or "" (the host tier)."""
    f = m.facts
    device = bool(gpu)
    s = plan.slots_per_layer
    m.set_slots(plan, pack_host=pack_host)
    ctx.reset()
    ctx.decode(toks[:12], prompt=True)                             # rows 0..11: prompt
    runner = NativeTier(m.ptr, plan, d, cost, device=device, share=gpu == "fetch-split") if d else None
    for t in toks[12:16]:                                         # rows 12..15: graphs (the tier's too)
        ctx.decode([t])
    per = []
    try:
        if runner is not None:
            runner.step(force=True)
            runner.counts = TierCounts()                           # count the timed rows only
        routing_stats.reset(ctx.ptr)
        for t in toks[16:16 + len(P)]:
            t1 = time.perf_counter()
            ctx.decode([t])
            per.append(time.perf_counter() - t1)
        if runner is not None:
            runner.step(force=True)
        c = runner.counts if runner is not None else None
    finally:
        if runner is not None:
            runner.close()
    st = ctx.read_stats()
    n = len(per)
    # the simulator steps the warm-up rows 12..15 too (the engine's tier did), then counts the timed ones
    core, first = masks(plan, d, f.n_expert)
    mech = {"fetch": FETCH, "fetch-split": FETCH_SPLIT}.get(gpu, ENGINE)
    sim = simulate_hybrid(np.concatenate([W, P]), core, d, cost, initial=first, mech=mech, warmup=len(W))
    # a GPU-stepped tier makes every pick resident before its experts run: its hits are the tier's counts
    hit = (c.core_hits + c.tier_hits) / max(1, P.size) if device and c else st.hit_rate
    return TierRow("", s, "", d, n / sum(per), 1000 * statistics.median(per), hit,
                   c.tier_hits / n if c else 0.0, (c.cpu if c else int(st.misses.sum())) / n,
                   c.uploads / n if c else 0.0, c.bytes / n / 1e6 if c else 0.0, sim.hit_rate,
                   sim.sync_uploads_per_token, sim.cpu_picks_per_token, sim.ms_per_token)


OFF = 0.10            # a row whose predicted ms/token is off the measured by more than this is flagged (!)

TIER_HEADER = ("| routing | slots | policy | core + tier | tok/s | ms/token | hit % | tier picks/token | "
               "CPU picks/token | uploads/token | MB/token | sim hit % | sim uploads/token | sim CPU/token | "
               "sim ms/token | sim error |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def sim_error(r: TierRow) -> float:
    """(predicted - measured) / measured ms/token."""
    return r.sim_ms_per_token / r.ms_per_token_median - 1 if r.ms_per_token_median > 0 else 0.0


def render_tier_row(r: TierRow) -> str:
    pol = r.policy if r.policy not in ("auto", "default") else f"{r.policy} -> {r.chosen.split(':', 1)[0]}"
    err = sim_error(r)
    tok = f"{r.decode_tok_s:.1f}" + (f" ({r.tok_s_min:.1f}–{r.tok_s_max:.1f})" if r.reps > 1 else "")
    return (f"| {r.routing} | {r.slots} | {pol} | {r.slots - r.tier} + {r.tier} | {tok} | "
            f"{r.ms_per_token_median:.2f} | {100 * r.hit_rate:.1f} | {r.tier_hits_per_token:.2f} | "
            f"{r.cpu_per_token:.2f} | {r.uploads_per_token:.2f} | {r.mb_per_token:.2f} | {100 * r.sim_hit_rate:.1f} | "
            f"{r.sim_uploads_per_token:.2f} | {r.sim_cpu_per_token:.2f} | {r.sim_ms_per_token:.2f} | "
            f"{100 * err:+.1f} %{' !' if abs(err) > OFF else ''} |")
