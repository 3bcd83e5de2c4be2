"""`moeslots bench`: decode and prompt speed of the static expert cache at several slot counts, with the routing
regime, hit rate and weight bytes crossing to the GPU per decode token, and greedy agreement with 0 slots.

Timed decode feeds random tokens one per step (teacher forcing): the same compute as greedy decoding, but routing
that does not collapse into the short cycles greedy text from random weights falls into. Greedy agreement is
measured separately.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from . import cache
from . import stats as stats_mod
from .cache import SlotPlan
from .model import Context, LoadOptions, Model
from ..profiles.plan import plan_from_counts


@dataclasses.dataclass
class BenchRow:
    slots: int
    pack_mib: float
    prompt_tok_s: float
    decode_tok_s: float
    ms_per_token_median: float
    ms_per_token_p90: float
    hit_rate: float
    upload_mb_per_token: float
    greedy_agreement: float | None
    distinct_per_layer: float
    top10_share: float
    load_line: str
    splits: int = -1                 # backend runs of a 1-token decode graph (-1: engine without the counter)


def _regime(picks: np.ndarray, moe_layers: Sequence[int]) -> tuple[float, float]:
    """Mean over the routed layers of (distinct experts, top-10 % share)."""
    per = [stats_mod.regime(picks[il]) for il in moe_layers if picks[il].sum() > 0]
    return (float(np.mean([d for d, _ in per])), float(np.mean([t for _, t in per]))) if per else (0.0, 0.0)


def run(model_path: Path, slot_counts: Sequence[int], *, n_decode: int = 128, prompt_len: int = 512,
        threads: int | None = None, mmap: bool = True, pack_host: bool = False, greedy_prompts: int = 4,
        greedy_tokens: int = 256, seed: int = 0, with_stats: bool = True, replay_from: str | None = None,
        greedy_slots: Sequence[int] | None = None,
        log: Callable[[str], None] = print) -> tuple[list[BenchRow], dict]:
    """greedy_slots: the slot counts that get the greedy-agreement run (None: all; 0 always runs when any does,
    it is the reference)."""
    opts = LoadOptions(experts_on_host=True, use_mmap=mmap, extra_bufts=not pack_host)
    m = Model(model_path, opts)
    f = m.facts
    moe = [il for il in f.moe_layers if il < f.n_layer]       # trunk layers (no MTP context here)
    n_ctx = max(prompt_len + n_decode, 64 + greedy_tokens) + 16
    ctx = Context(m, n_ctx=n_ctx, n_batch=max(512, prompt_len), threads=threads)
    ctx.enable_stats(ring_rows=0)          # the warm-up profile needs them; turned off below if asked
    routing = "the model's router"
    if replay_from:
        from . import replay

        table = (replay.uniform(4096, len(moe), f.n_expert, f.n_expert_used, seed=seed) if replay_from == "uniform"
                 else replay.from_trace(Path(replay_from), f.n_expert, f.n_expert_used))
        replay.set_replay(ctx.ptr, table)
        routing = "replayed: " + table.source
    rng = np.random.default_rng(seed)
    n_normal = m.n_vocab - 16
    prompt = [int(t) for t in rng.integers(0, n_normal, prompt_len)]
    stream = [int(t) for t in rng.integers(0, n_normal, n_decode)]
    greedy_starts = [[int(t) for t in rng.integers(0, n_normal, 32)] for _ in range(greedy_prompts)]
    info = {"model": str(model_path), "arch": f.arch, "n_layer": f.n_layer, "n_expert": f.n_expert,
            "k": f.n_expert_used, "mmap": mmap, "threads": threads, "n_decode": n_decode, "prompt_len": prompt_len,
            "stats": with_stats, "routing": routing}

    def timed() -> tuple[float, list[float], "stats_mod.RoutingStats | None", int]:
        ctx.reset()
        stats_mod.reset(ctx.ptr)
        t0 = time.perf_counter()
        ctx.decode(prompt, prompt=True)
        pp = time.perf_counter() - t0
        b0 = stats_mod.weight_copy_bytes()
        per = []
        for t in stream:
            t1 = time.perf_counter()
            ctx.decode([t])
            per.append(time.perf_counter() - t1)
        moved = stats_mod.weight_copy_bytes() - b0
        st = ctx.read_stats() if ctx.stats_ring >= 0 else None
        return pp, per, st, moved

    def warm() -> None:
        """After a reconfigure: build the prompt-path and decode-path graphs once."""
        ctx.reset()
        ctx.decode(prompt[:64], prompt=True)
        for t in stream[:4]:
            ctx.decode([t])

    def greedy() -> list[list[int]]:
        outs = []
        for start in greedy_starts:
            ctx.reset()
            ctx.decode(start, prompt=True)
            toks = []
            for _ in range(greedy_tokens):
                t = ctx.argmax()
                toks.append(t)
                ctx.decode([t])
            outs.append(toks)
        return outs

    rows: list[BenchRow] = []
    log("warm-up + profile (0 slots)")
    timed()                                                  # warm-up: page in the weights
    _, _, prof, _ = timed()
    assert prof is not None
    profile = prof.picks_decode + prof.picks_prompt
    if not with_stats:
        ctx.disable_stats()
    ref_greedy = None
    for s in slot_counts:
        s = min(s, f.n_expert)
        line = m.set_slots(SlotPlan(plan_from_counts(profile, s, moe)), pack_host=pack_host)
        log(f"{s} slots: {line}")
        warm()
        pp, per, st, moved = timed()
        splits = ctx.graph_splits()                            # of the last graph: a 1-token decode
        want = greedy_prompts and (greedy_slots is None or s in greedy_slots or (s == 0 and ref_greedy is None))
        g = greedy() if want else None
        if s == 0:
            ref_greedy = g
        agree = None
        if g is not None and ref_greedy is not None:
            a = np.array(g) == np.array(ref_greedy)
            agree = float(a.mean())
        distinct, top10 = _regime(st.picks_decode, moe) if st is not None else (float("nan"), float("nan"))
        rows.append(BenchRow(
            slots=s, pack_mib=cache.pack_bytes(m.ptr) / 2**20, prompt_tok_s=prompt_len / pp,
            decode_tok_s=len(per) / sum(per), ms_per_token_median=1000 * statistics.median(per),
            ms_per_token_p90=1000 * float(np.percentile(per, 90)), hit_rate=st.hit_rate if st else float("nan"),
            upload_mb_per_token=moved / len(per) / 1e6, greedy_agreement=agree, distinct_per_layer=distinct,
            top10_share=top10, load_line=line, splits=splits))
        log(render_row(rows[-1]))
    ctx.close()
    m.close()
    return rows, info


def render_row(r: BenchRow) -> str:
    agree = "-" if r.greedy_agreement is None else f"{100 * r.greedy_agreement:.1f} %"
    return (f"| {r.slots} | {r.pack_mib:.0f} | {r.decode_tok_s:.1f} | {r.ms_per_token_median:.2f} | "
            f"{r.ms_per_token_p90:.2f} | {100 * r.hit_rate:.1f} % | {r.upload_mb_per_token:.2f} | "
            f"{r.prompt_tok_s:.0f} | {agree} | {r.distinct_per_layer:.1f} / {100 * r.top10_share:.1f} % | {r.splits} |")


HEADER = ("| slots/layer | pack MiB | decode tok/s | ms/token median | p90 | hit rate | weights MB/token to GPU | "
          "prompt tok/s | greedy agreement vs 0 | routing: distinct/layer, top-10 % | splits/token |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def render(rows: list[BenchRow], info: dict) -> str:
    head = (f"model {info['model']} ({info['arch']}, {info['n_layer']} layers, {info['n_expert']} experts, "
            f"k={info['k']}), {'mmap' if info['mmap'] else 'no mmap (pinned host)'}, threads {info['threads']}, "
            f"prompt {info['prompt_len']}, decode {info['n_decode']} random tokens, stats {'on' if info['stats'] else 'off'}, "
            f"routing: {info['routing']}; plan: per layer the top-S experts of a 0-slot pass over the same input "
            f"(in-sample)")
    return "\n".join([head, HEADER] + [render_row(r) for r in rows])


def save(rows: list[BenchRow], info: dict, path: Path) -> None:
    path.write_text(json.dumps({"info": info, "rows": [dataclasses.asdict(r) for r in rows]}, indent=1))


@dataclasses.dataclass
class MTPRow:
    slots: int
    draft: int
    plain_tok_s: float
    mtp_tok_s: float
    acceptance: float
    tokens_per_step: float
    same_text: bool
    same_prefix: int               # tokens equal to plain greedy before the first difference
    ms_step: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)   # per step: feed, drafts, verify, rest


def run_mtp(model_path: Path, slot_counts: Sequence[int], drafts: Sequence[int], *, n_tokens: int = 128,
            threads: int | None = None, pack_host: bool = False, seed: int = 0, prompt_text: str | None = None,
            mtp_head: str = "gpu", replay_from: str | None = None, mmap: bool = True,
            log: Callable[[str], None] = print) -> list[MTPRow]:
    """Greedy decode tok/s with and without MTP drafts at each slot count and draft length (plan: top-S of a
    0-slot profiling pass). mtp_head: where the NextN block's experts live: "slots" (host memory, in the plan
    like a trunk layer), "host" (host memory, no slots) or "gpu" (on the GPU with the rest of its layer). prompt_text: a user turn rendered with
    the model's chat template (trained models: real acceptance); default random tokens. replay_from ("uniform" or a
    trace CSV): the trunk routes through those ids (a random model's greedy text repeats itself, and so would its
    routing); the plan is then the top-S of the 1,024 rows before the replayed ones (out of sample)."""
    from .mtp import MTP, greedy_tokens

    if mtp_head not in ("slots", "host", "gpu"):
        raise ValueError(f"--mtp-head is slots, host or gpu, not {mtp_head!r}")
    m = Model(model_path, LoadOptions(experts_on_host=True, load_mtp=True, mtp_head_on_gpu=mtp_head == "gpu",
                                      extra_bufts=not pack_host, use_mmap=mmap))
    if not m.mtp_loaded:
        m.close()
        raise ValueError(f"{model_path} has no NextN (MTP) block")
    f = m.facts
    ctx = Context(m, n_ctx=n_tokens + 256, n_batch=512, threads=threads, rollback=max(drafts))
    plan_counts = None
    if replay_from:
        if mtp_head == "slots":
            raise ValueError("--replay replays the trunk's routing: use --mtp-head gpu or host with it")
        from . import replay
        from ..profiles.simulate import layer_counts

        trunk = [il for il in f.moe_layers if il < f.n_layer]
        need = 1024 + ctx.n_ctx
        full = (replay.uniform(need, len(trunk), f.n_expert, f.n_expert_used, seed=7) if replay_from == "uniform"
                else replay.from_trace(Path(replay_from), f.n_expert, f.n_expert_used))
        if full.n_rows < need:
            raise ValueError(f"{replay_from}: {full.n_rows} decode rows, the benchmark needs {need}")
        plan_counts = layer_counts(full.per_layer(trunk)[:1024], trunk, f.n_expert)
        replay.set_replay(ctx.ptr, replay.ReplayTable(full.ids[1024:need], full.source))
        log(f"routing replayed: {full.source}; plan from the 1,024 rows before the replayed ones")
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(0, m.n_vocab - 16, 64)]
    if prompt_text is not None:
        from .engine import Message, render_chat

        prompt = m.tokenize(render_chat(m, [Message("user", prompt_text)]), add_special=False, parse_special=True)
    ctx.enable_stats(ring_rows=0)
    ctx.decode(prompt, prompt=True)
    for t in rng.integers(0, m.n_vocab - 16, 128):
        ctx.decode([int(t)])
    prof = ctx.read_stats()
    ctx.disable_stats()
    counts = prof.picks_decode + prof.picks_prompt if plan_counts is None else plan_counts
    rows: list[MTPRow] = []

    def plain() -> tuple[list[int], float]:
        ctx.reset()
        ctx.decode(prompt, prompt=True)
        out = []
        t0 = time.perf_counter()
        for _ in range(n_tokens):
            t = ctx.argmax()
            out.append(t)
            ctx.decode([t])
        return out, time.perf_counter() - t0

    for s in slot_counts:
        s = min(s, f.n_expert)
        layers = f.moe_layers if mtp_head == "slots" else [il for il in f.moe_layers if il < f.n_layer]
        m.set_slots(SlotPlan(plan_from_counts(counts, s, layers)), pack_host=pack_host)
        plain()                                                  # warm-up (graphs)
        ref, dt_plain = plain()
        for d in drafts:
            mtp = MTP(m, ctx, n_draft=d, threads=threads)
            try:
                greedy_tokens(mtp, prompt, 16, lambda t: False)    # warm-up
                mtp.stats = type(mtp.stats)()
                ctx.reset()
                t0s: list[float] = []                              # decode time only, as plain(): the
                got = greedy_tokens(mtp, prompt, n_tokens, lambda t: False,   # prompt (both contexts) is not
                                    on_prefilled=lambda t0s=t0s: t0s.append(time.perf_counter()))   # timed
                dt = time.perf_counter() - t0s[0]
            finally:
                mtp.close()
            prefix = next((i for i, (x, y) in enumerate(zip(got, ref)) if x != y), min(len(got), len(ref)))
            st = mtp.stats
            per = tuple(1000 * v / max(1, st.steps) for v in (st.t_feed, st.t_draft, st.t_verify, st.t_other))
            row = MTPRow(s, d, n_tokens / dt_plain, len(got) / dt, st.acceptance, st.tokens_per_step,
                         got == ref[:len(got)], prefix, per)  # type: ignore[arg-type]
            rows.append(row)
            log(f"| {s} | {d} | {row.plain_tok_s:.1f} | {row.mtp_tok_s:.1f} | {100 * row.acceptance:.0f} % | "
                f"{row.tokens_per_step:.2f} | {'yes' if row.same_text else f'first {row.same_prefix} of {len(got)}'} | "
                + " / ".join(f"{v:.1f}" for v in row.ms_step) + " |")
    ctx.close()
    m.close()
    return rows


# ---------------------------------------------------------------------------------------------------------------
# adaptive residency: static vs re-pick every N tokens, under replayed routing, with the simulator's prediction


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
               cost: "object | None" = None, overlap: bool = False, auto_every: int | None = None,
               profile_from: str | None = None,
               log: Callable[[str], None] = print) -> tuple[list[RepickRow], dict]:
    """For each routing (a trace CSV, or "uniform"), replayed through the router: the static plan is the top-S of
    the first `profile_rows` rows (the profile); the timed decode replays the rows after them. Re-picks run
    between decode steps exactly as in the engine (cache.repick), their copies inside the timed step; with
    overlap=True they are staged on a worker thread and committed between steps (cache.Stager, as the engine does),
    so a re-pick's swaps arrive over the next tokens. The simulator runs the same rows with the same rule
    (profiles.simulate._reelect; it applies swaps at once) under `cost`. Interval AUTO is live `--repick auto`:
    the interval chosen at load from the profile rows (choose_repick), then chosen again every `auto_every` tokens
    on the rows just decoded, from the plan held when they began (choose_repick_from, untimed, as the engine does
    it between replies); the simulator runs the same schedule. `profile_from` (a trace CSV): the profile rows come
    from that trace instead of the replayed one — a chat that is not what its profile recorded."""
    from . import replay
    from .engine import AUTO_EVERY
    from ..profiles.simulate import (CostModel, Picks, _reelect, _resident_from_plan, _static, choose_repick,
                                            choose_repick_from, layer_counts, run_schedule)

    auto_every = auto_every or AUTO_EVERY
    for every in intervals:
        if every >= n_decode:
            log(f"note: re-pick {every} never fires in {n_decode} decode tokens (its row measures static again); "
                f"-n {2 * every} or more measures it")
    m = Model(model_path, LoadOptions(experts_on_host=True, use_mmap=mmap, extra_bufts=not pack_host))
    f = m.facts
    moe = [il for il in f.moe_layers if il < f.n_layer]
    slab_mb = f.slab_bytes / 1e6
    cost = cost or CostModel(slab_mb=slab_mb)
    ctx = Context(m, n_ctx=n_decode + 64, threads=threads)
    ctx.enable_stats(ring_rows=(window + 8) * (len(moe) + 2))
    rng = np.random.default_rng(0)
    toks = [int(t) for t in rng.integers(0, m.n_vocab - 16, n_decode + 16)]
    info = {"model": str(model_path), "n_layer": f.n_layer, "n_expert": f.n_expert, "k": f.n_expert_used,
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
                initial = _resident_from_plan(dict(plan0.layers), moe, f.n_expert)
                m.set_slots(plan0, pack_host=pack_host, spare=overlap)  # one full upload per slot count
                if stager is not None:
                    stager.close()
                stager = cache.Stager(m.ptr) if overlap else None
                plan = plan0
                for every in intervals:
                    _restore(m, plan, plan0, pack_host, overlap)         # undo the last policy's swaps only
                    plan = plan0
                    cur = (choose_repick(Picks(prof, moe, f.n_expert), s, cost, max_swaps=max_swaps,
                                         margin=margin)[0] if every == AUTO else every)
                    sched_of, held = [(0, cur)], plan0
                    ctx.reset()
                    ctx.decode(toks[:12], prompt=True)                     # rows 0..11: prompt
                    for t in toks[12:16]:                                 # rows 12..15: graphs, ring warm
                        ctx.decode([t])
                    stats_mod.reset(ctx.ptr)
                    b0 = stats_mod.weight_copy_bytes()
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
                            n2 = choose_repick_from(Picks(P[:i], moe, f.n_expert), dict(held.layers), cost,
                                                    last=auto_every, current=cur, max_swaps=max_swaps,
                                                    margin=margin)[0]
                            if n2 != cur:
                                cur, since = n2, 0
                                sched_of.append((i, n2))
                            held = plan
                    if stager is not None:
                        stager.drain()                             # copies still in flight are dropped
                    st = ctx.read_stats()
                    sched = stats_mod.weight_copy_bytes() - b0
                    if every == AUTO:
                        shr, sup = run_schedule(P, 0, initial, s, sched_of, window, max_swaps, margin)
                    elif every:
                        shr, sup = _reelect(P, s, f.n_expert, every, window, initial,
                                            max_swaps=max_swaps, margin=margin)
                    else:
                        shr, sup = _static(P, initial)[0], 0.0
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
