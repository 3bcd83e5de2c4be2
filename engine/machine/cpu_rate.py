"""The CPU's expert rate and the token's base with slots in every layer, at one thread count: what the cost model
needs to price the experts a static plan leaves to the CPU (engine.calibrate, engine.autocal).

Static decodes at S slots under two replayed routings, taking turns: "miss", uniform over every expert (about
(E - S) / E of the picks go to the CPU), and "hit", uniform over the S experts in slots (none go to the CPU). Both run
the same graph with the same splits, copies and launches, so what differs is the CPU's expert work alone, and its
bytes are known exactly from the engine's stats. The time of that work is read from the scheduler's clock (the CPU
splits' compute) where the engine has it; the wall clock otherwise. The token's wall time also holds the host's wait
for the GPU's queue and the copies, which drift with the GPU; the CPU's own compute is what the rate is about.
Each pair's difference is taken, then the median of the pairs: the CPU's throughput drifts over seconds (two walls'
difference once gave 32 and 68 GB/s back to back), and adjacent readings drift together. When the pairs' rates
still disagree by more than SPREAD (right after a 16 GB pinned load, three pairs gave 99, 60 and 46 GB/s where the
machine does 80-110), two pairs more are read and the median is over all of them.
Without a GPU (hot packs in host memory) both chains run on the CPU and the two routings cost about the same: the rate
is then the "miss" reading's CPU bytes over its whole token time, a lower bound, and the method says so.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from ..llm.model import Context, Model
from ..native import replay, routing_stats
from ..native.expert_cache import SlotPlan
from .fetch_rates import decode_ms

ORDER = ("miss", "hit") * 3     # readings taking turns: three pairs
MORE = ("miss", "hit") * 2      # two pairs more when the first ones disagree
SPREAD = 1.25                   # the pairs disagree when their fastest rate is this much over their slowest
MIN_GAIN = 0.05                 # the CPU's work must be at least this share of the "miss" token to be measured


@dataclasses.dataclass(frozen=True)
class Reading:
    ms: float                       # wall ms per token (the median of one-token decodes)
    picks: float                    # picks computed on the CPU per token (the engine's stats)
    cpu_ms: float | None = None     # the CPU splits' compute per token, by the scheduler's clock (None: no clock)


def pair_routes(n_layers: int, n_expert: int, k: int, S: int) -> dict[str, replay.ReplayTable]:
    """The pair's routings at S slots (experts 0..S-1 resident): "miss", uniform over every expert, and "hit",
    uniform over the S experts in slots."""
    return {"miss": replay.uniform(4096, n_layers, n_expert, k, seed=1),
            "hit": replay.uniform(4096, n_layers, S, k, seed=2)}         # ids < S: every pick in a slot


def reading(ctx: Context, route: replay.ReplayTable, toks: list[int], clock: bool = True) -> Reading:
    """One reading: `route` replayed from a fresh context (toks[:8] its prompt, toks[8] a decode that builds the
    decode graph), the one-token decodes of toks[9:] timed, their CPU picks from the engine's stats (enabled on
    ctx), and with `clock` the CPU splits' compute by the scheduler's clock where the engine has one."""
    replay.set_replay(ctx.ptr, route)
    ctx.reset()
    ctx.decode(toks[:8], prompt=True)
    ctx.decode([toks[8]])
    routing_stats.reset(ctx.ptr)
    clock = clock and routing_stats.sched_timing(True) is not None
    ms = decode_ms(ctx, toks[9:])
    t = routing_stats.sched_timing(False) if clock else None
    cpu_ms = t.cpu_compute_us / 1e3 / len(toks[9:]) if t is not None else None
    return Reading(ms, float(ctx.read_stats().misses.sum()) / len(toks[9:]), cpu_ms)


def cpu_rate(m: Model, moe: list[int], threads: int, n_tokens: int, S: int, pack_host: bool,
             log: Callable[[str], None], ctx: Context | None = None,
             order: tuple[str, ...] = ORDER) -> tuple[float, float, str]:
    """(CPU expert GB/s, base ms/token, method) at `threads`, static at S slots in every MoE layer (see the module's
    text). ctx: a context of this model to decode in (at least n_tokens + 9 positions; default: one of its own)."""
    f = m.facts
    k = f.n_expert_used
    S = max(k, min(S, f.n_expert))
    routes = pair_routes(len(moe), f.n_expert, k, S)
    own = ctx is None
    ctx = Context(m, n_ctx=n_tokens + 64, threads=threads) if ctx is None else ctx
    readings: dict[str, list[Reading]] = {"miss": [], "hit": []}
    try:
        ctx.enable_stats(ring_rows=0)
        m.set_slots(SlotPlan({il: tuple(range(S)) for il in moe}), pack_host=pack_host)
        rng = np.random.default_rng(0)
        toks = [int(t) for t in rng.integers(0, m.n_vocab - 16, n_tokens + 8)]
        def read(what: str) -> None:
            r = reading(ctx, routes[what], toks)
            readings[what].append(r)
            log(f"{threads} threads, {S} slots, {what} routing: {r.ms:.2f} ms/token, {r.picks:.1f} CPU picks/token"
                + (f", CPU compute {r.cpu_ms:.2f} ms" if r.cpu_ms is not None else ""))

        for what in order:
            read(what)
        rates = pair_rates(readings["miss"], readings["hit"], f.slab_bytes / 1e6)
        if not pack_host and disagree(rates):
            log(f"the pairs disagree ({', '.join(f'{r:.0f}' for r in rates)} GB/s): {len(MORE) // 2} pairs more")
            for what in MORE:
                read(what)
    finally:
        m.set_slots(SlotPlan({}), pack_host=pack_host)
        replay.set_replay(ctx.ptr, None)
        if own:
            ctx.close()
    return rate_from_readings(readings["miss"], readings["hit"], f.slab_bytes / 1e6, pack_host)


def _difference(a: Sequence[float], b: Sequence[float]) -> float:
    """a - b: the median of the pairs' differences when they pair up, else the difference of the medians."""
    if len(a) == len(b):
        return float(np.median(np.subtract(a, b)))
    return float(np.median(a) - np.median(b))


def pair_rates(miss: Sequence[Reading], hit: Sequence[Reading], slab_mb: float) -> list[float]:
    """Each pair's CPU rate (GB/s; 0 where its difference is not positive), by the clock where both have it."""
    out = []
    for a, b in zip(miss, hit):
        dt = (a.cpu_ms - b.cpu_ms) if a.cpu_ms is not None and b.cpu_ms is not None else a.ms - b.ms
        out.append((a.picks - b.picks) * slab_mb / dt if dt > 0 and a.picks > b.picks else 0.0)
    return out


def disagree(rates: Sequence[float]) -> bool:
    """Whether pairs' rates are too far apart for their median to be trusted (or one has no rate at all)."""
    return len(rates) > 1 and (min(rates) <= 0 or max(rates) > SPREAD * min(rates))


def rate_from_readings(miss: Sequence[Reading], hit: Sequence[Reading], slab_mb: float,
                       pack_host: bool) -> tuple[float, float, str]:
    """(CPU GB/s, base ms, method) from readings with more ("miss") and fewer ("hit") picks on the CPU at the same
    slots: the bytes between them over the time between them, by the scheduler's clock when every reading has it;
    the base is what the "miss" token spends beside its CPU picks. No measurable difference (or packs in host
    memory): the "miss" bytes over its time, a lower bound."""
    if not miss or not hit:
        raise ValueError("the CPU rate needs readings of both routings")
    t_miss = float(np.median([r.ms for r in miss]))
    c_miss = float(np.median([r.picks for r in miss]))
    dc = _difference([r.picks for r in miss], [r.picks for r in hit])
    clock = all(r.cpu_ms is not None for r in (*miss, *hit))
    dt = (_difference([r.cpu_ms or 0.0 for r in miss], [r.cpu_ms or 0.0 for r in hit]) if clock
          else _difference([r.ms for r in miss], [r.ms for r in hit]))
    if not pack_host and dt > MIN_GAIN * t_miss and dc > 0:
        gbps = dc * slab_mb / dt                                   # MB/ms = GB/s
        return gbps, max(0.0, t_miss - c_miss * slab_mb / gbps), "split, scheduler clock" if clock else "split"
    return ((c_miss * slab_mb / t_miss if t_miss > 0 else 0.0), 0.0,
            "cpu-only lower bound" if pack_host else "lower bound (no measurable gain from slots)")
