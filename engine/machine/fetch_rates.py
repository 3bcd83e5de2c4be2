"""The GPU-stepped tier's own costs (`--policy fetch` / `fetch-split`), measured with the engine for a calibration
(engine.calibrate, engine.autocal): what the cost model needs to predict both from what this machine does.

Each is read off decodes under uniform replayed routing with every slot a tier, the bytes and CPU misses counted by
the engine itself:
- the GPU's reading rate and the token's fixed part, from plain fetch decodes at S and at S/2 slots (a line through
  two points): fetch_gbps = (MB copied/token at S/2 - at S) / (ms/token at S/2 - at S), and fetch_base_ms = ms/token
  at S/2 - its MB / fetch_gbps: what a stepped token costs apart from its copies.
- the CPU share's own cost per layer (share_ms): at S/2, plain and with a share whose CPU is a million times dearer
  than a copy (every miss still copied: the counts must say so), taking turns for a few rounds; the median of the
  rounds' differences over the layers.
- what the share itself costs: a share at this machine's costs (`cost`), which must give the CPU misses, fitted layer
  by layer (profiles.sharefit: the simulator splits the same routing as the engine did, and the counts must agree):
  the GPU's own work the share runs beside (share_overlap_ms), or where the share ran slower than the CPU streams,
  its rate (share_cpu_gbps). Measured SHARE_FITS times, each share split by what the one before found (the same
  split when only the overlap was fitted), each fit over every share so far.
0 where not measurable (no tier on this device, too few experts, no time difference), with a line saying why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable

import numpy as np

from ...profiles.costs import CostModel
from ...profiles.sharefit import ShareFit, Steps, fit_share, share_steps
from ..llm.model import Context, Model
from ..native import replay
from ..native.expert_cache import CacheError, SlotPlan
from ..native.tier import NativeTier, TierCounts

ROUNDS = 3          # plain / dear-share pairs at S/2, taking turns
MIN_SHARE_MS = 1e-4  # a share measured to cost nothing (or less: noise) per layer: 0.1 us, not 0 (not measured)
SHARE_FITS = 4      # shares at this machine's costs, each split by what the one before found, fitted together
                    # (one 16-token decode moves 3 %, the room the fit has)


@dataclasses.dataclass(frozen=True)
class TierRun:
    ms: float       # median ms per decode token
    mb: float       # MB copied into the tier per token
    cpu: int        # misses computed on the CPU


@dataclasses.dataclass(frozen=True)
class FetchCosts:
    gbps: float = 0.0               # the GPU reading pinned host memory
    base_ms: float = 0.0            # a stepped token apart from its copies
    share_ms: float = 0.0           # a CPU share's wait and join, per layer and token
    share_cpu_gbps: float = 0.0     # the CPU's rate on its share (0: its streaming rate)
    share_overlap_ms: float = 0.0   # per layer, the GPU's own work the share runs beside
    raw: tuple[str, ...] = ()       # each decode measured, one line


def decode_ms(ctx: Context, toks: list[int]) -> float:
    """The median ms of one-token decodes of toks, one after the other."""
    per = []
    for t in toks:
        t1 = time.perf_counter()
        ctx.decode([t])
        per.append(time.perf_counter() - t1)
    return float(np.median(per)) * 1e3


def fetch_rates(m: Model, moe: list[int], S: int, threads: int, n_tokens: int, pack_host: bool,
                log: Callable[[str], None], cost: CostModel | None = None,
                ctx: Context | None = None) -> FetchCosts:
    """The GPU-stepped tier's costs on this model at `threads` (see the module's text); cost: this machine's CPU
    rate for the share's split (default: the cost model's); ctx: a context of this model to decode in (at least
    n_tokens + 9 positions; default: one of its own)."""
    f = m.facts
    sizes = sorted({s for s in (S, S // 2) if f.n_expert_used <= s < f.n_expert}, reverse=True)
    if len(sizes) < 2:
        log(f"GPU-stepped tier: not measured ({S} slots leave no two tier sizes between {f.n_expert_used} and "
            f"{f.n_expert} experts)")
        return FetchCosts()
    toks = [int(t) for t in np.random.default_rng(3).integers(0, m.n_vocab - 16, n_tokens + 9)]
    cost = cost or CostModel()
    dear = dataclasses.replace(cost, cpu_gbps=cost.fetch_gbps * 1e-6, share_cpu_gbps=0.0)
    raw: list[str] = []

    def run(s: int, share: bool, c: CostModel = dear) -> TierRun | None:
        r = _tier_run(m, dctx, moe, s, share, c, toks, pack_host, log)
        if r is not None:
            line = (f"GPU-stepped tier{' with a CPU share' if share else ''}, {s} slots: {r.ms:.2f} ms/token, "
                    f"{r.mb:.1f} MB copied/token" + (f", {r.cpu} CPU misses" if r.cpu else ""))
            raw.append(line)
            log(line)
        return r

    with contextlib.nullcontext(ctx) if ctx is not None else Context(m, n_ctx=n_tokens + 64, threads=threads) as dctx:
        routing = replay.uniform(4096, len(moe), f.n_expert, f.n_expert_used, seed=4)
        replay.set_replay(dctx.ptr, routing)
        try:
            big, half = run(sizes[0], False), run(sizes[1], False)
            if big is None or half is None:
                return FetchCosts(raw=tuple(raw))
            plain: list[TierRun] = [half]
            shared: list[TierRun] = []
            for i in range(ROUNDS):
                for share in ((True, False) if i % 2 == 0 else (False, True)):    # taking turns: drift cancels
                    if i == 0 and not share:
                        continue                                                # round 0's plain run is `half`
                    r = run(sizes[1], share)
                    if r is None:
                        return _line(big, _median_run(plain), raw)
                    (shared if share else plain).append(r)
            line = _line(big, _median_run(plain), raw)
            share_ms = _share_ms(shared, plain, half, len(moe), log)
            fit: ShareFit | None = None
            if share_ms > 0:
                c = dataclasses.replace(cost, fetch_gbps=line.gbps or cost.fetch_gbps, fetch_base_ms=line.base_ms,
                                        share_ms=share_ms, share_cpu_gbps=0.0, share_overlap_ms=0.0)
                first = np.zeros((len(moe), f.n_expert), bool)
                first[:, :sizes[1]] = True
                P = routing.per_layer(moe)[8:len(toks)]                 # the warm-up decode's row, then the timed
                runs: list[tuple[Steps, float]] = []      # every share decode so far, fitted together
                for i in range(SHARE_FITS):
                    r = run(sizes[1], True, c)
                    if r is None or r.cpu == 0:
                        if i == 0:              # (a later share split by a slow CPU may rightly copy everything)
                            log("the CPU share did not run (no miss went to the CPU at this machine's costs): its "
                                "cost is not measured")
                            share_ms = 0.0
                        break
                    if line.gbps <= 0:          # the line unknown: not fitted
                        break
                    steps = share_steps(P, sizes[1], c, initial=first, warmup=1)
                    sim_mb = steps.copies * f.slab_bytes / 1e6 / max(1, steps.tokens)
                    if steps.cpu_misses != r.cpu or abs(sim_mb - r.mb) > 1e-6 * max(1.0, r.mb):
                        log(f"the CPU share's split is not the simulator's ({r.mb:.1f} MB copied/token and {r.cpu} "
                            f"CPU misses, simulated {sim_mb:.1f} and {steps.cpu_misses}): its costs are not fitted")
                        break
                    runs.append((steps, r.ms))
                    fit = fit_share(runs, sizes[1], c)
                    raw.append(fit.line())
                    log(fit.line())
                    c = dataclasses.replace(c, share_cpu_gbps=fit.cpu_gbps, share_overlap_ms=fit.overlap_ms)
        finally:
            replay.set_replay(dctx.ptr, None)
            m.set_slots(SlotPlan({}), pack_host=pack_host)
    return dataclasses.replace(line, share_ms=share_ms, share_cpu_gbps=fit.cpu_gbps if fit else 0.0,
                               share_overlap_ms=fit.overlap_ms if fit else 0.0, raw=tuple(raw))


def _line(big: TierRun, half: TierRun, raw: list[str]) -> FetchCosts:
    """The reading rate and the fixed part from two plain runs (big: more slots, fewer bytes)."""
    if not (half.ms > big.ms and half.mb > big.mb):
        return FetchCosts(raw=tuple(raw))
    gbps = (half.mb - big.mb) / (half.ms - big.ms)                 # MB/ms = GB/s
    return FetchCosts(gbps=gbps, base_ms=max(0.0, half.ms - half.mb / gbps), raw=tuple(raw))


def _share_ms(shared: list[TierRun], plain: list[TierRun], half: TierRun, layers: int,
              log: Callable[[str], None]) -> float:
    """The median of the paired differences per layer (at least MIN_SHARE_MS: 0 means not measured); 0 when a dear
    share did not copy every miss (a share that does not behave as one is not measured)."""
    if any(r.cpu or abs(r.mb - half.mb) > 1e-9 + 1e-6 * half.mb for r in shared):
        log("the CPU share with a dear CPU did not copy every miss: its cost is not measured")
        return 0.0
    diffs = [(s.ms - p.ms) / layers for s, p in zip(shared, plain)]
    return max(float(np.median(diffs)), MIN_SHARE_MS)


def _tier_run(m: Model, ctx: Context, moe: list[int], s: int, share: bool, cost: CostModel, toks: list[int],
              pack_host: bool, log: Callable[[str], None]) -> TierRun | None:
    """One decode of toks[9:] with every one of s slots per layer a GPU-stepped tier; None where the device refuses
    the tier (logged)."""
    plan = SlotPlan({il: tuple(range(s)) for il in moe})
    m.set_slots(plan, pack_host=pack_host)
    ctx.reset()
    ctx.decode(toks[:8], prompt=True)
    try:
        tier = NativeTier(m.ptr, plan, s, cost, device=True, share=share)
    except CacheError as e:                         # this device cannot step it: not measured
        log(f"GPU-stepped tier: {e}")
        return None
    try:
        ctx.decode([toks[8]])                       # graphs for this configuration
        tier.step(force=True)
        tier.counts = TierCounts()
        ms = decode_ms(ctx, toks[9:])
        tier.step(0, force=True)
        return TierRun(ms, tier.counts.bytes / len(toks[9:]) / 1e6, tier.counts.cpu)
    finally:
        tier.close()


def _median_run(runs: list[TierRun]) -> TierRun:
    return sorted(runs, key=lambda r: r.ms)[len(runs) // 2]
