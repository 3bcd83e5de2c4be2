"""The host tier's own cost per layer (`--policy hybrid` / `dynamic`, patch 0007), measured with the engine for a
calibration (engine.calibrate, engine.autocal): what the cost model's route_ms needs.

With a host tier every partly resident layer runs a route node on the CPU after its router: it scores the picks,
splits the misses, and writes the ids both chains read, so the slot chain on the GPU waits for a host round trip it
does not wait for under static. The measurement: static at S slots and the same plan with its last S/4 slots a host
tier whose uploads cost a million times a CPU expert (it moves nothing: the counts must say so), under the same
uniform replayed routing, taking turns; route_ms is the median of the paired differences per layer with a tier.
0 where not measurable (no tier, the tier moved something, no difference), with a line saying why.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ...profiles.costs import CostModel
from ..llm.model import Context, Model
from ..native import replay
from ..native.expert_cache import CacheError, SlotPlan
from ..native.tier import NativeTier
from .fetch_rates import decode_ms

ROUNDS = 3          # static / tier pairs, taking turns
MIN_ROUTE_MS = 1e-4  # a route measured to cost nothing (or less: noise) per layer: 0.1 us, not 0 (not measured)


@dataclasses.dataclass(frozen=True)
class RouteCost:
    route_ms: float = 0.0           # per layer with a tier and decode step (0: not measured)
    raw: tuple[str, ...] = ()       # each decode measured, one line


def route_cost(m: Model, moe: list[int], S: int, threads: int, n_tokens: int, pack_host: bool,
               log: Callable[[str], None], ctx: Context | None = None) -> RouteCost:
    """The host tier's cost per layer beyond static's on this model at `threads` (see the module's text); ctx: a
    context of this model to decode in (at least n_tokens + 9 positions; default: one of its own)."""
    f = m.facts
    S = min(S, f.n_expert - 1)
    d = S // 4
    if d < 1:
        log(f"the host tier's route: not measured ({S} slots leave no tier)")
        return RouteCost()
    toks = [int(t) for t in np.random.default_rng(5).integers(0, m.n_vocab - 16, n_tokens + 9)]
    dear = CostModel(slab_mb=f.slab_bytes / 1e6, cpu_gbps=1e3, pcie_gbps=1e-3, base_ms=1.0)    # no upload pays
    plan = SlotPlan({il: tuple(range(S)) for il in moe})
    raw: list[str] = []
    own = ctx is None
    ctx = Context(m, n_ctx=n_tokens + 64, threads=threads) if ctx is None else ctx
    ms: dict[bool, list[float]] = {False: [], True: []}
    layers = 0
    try:
        m.set_slots(plan, pack_host=pack_host)
        replay.set_replay(ctx.ptr, replay.uniform(4096, len(moe), f.n_expert, f.n_expert_used, seed=6))
        for i in range(ROUNDS):
            for tiered in ((False, True) if i % 2 == 0 else (True, False)):        # taking turns: drift cancels
                ctx.reset()
                ctx.decode(toks[:8], prompt=True)
                tier = None
                try:
                    if tiered:
                        tier = NativeTier(m.ptr, plan, d, dear)
                        layers = tier.n_layers
                    ctx.decode([toks[8]])                                         # graphs for this configuration
                    if tier is not None:
                        tier.step()
                    t = decode_ms(ctx, toks[9:])
                    if tier is not None:
                        tier.step(len(toks) - 9, force=True)
                        if tier.counts.uploads:
                            log(f"the host tier's route: not measured (the tier uploaded {tier.counts.uploads} "
                                "experts where every upload was dear)")
                            return RouteCost(raw=tuple(raw))
                except CacheError as e:
                    log(f"the host tier's route: not measured ({e})")
                    return RouteCost(raw=tuple(raw))
                finally:
                    if tier is not None:
                        tier.close()
                ms[tiered].append(t)
                line = f"{'host tier' if tiered else 'static'}, {S} slots{f' ({d} tier)' if tiered else ''}: " \
                       f"{t:.2f} ms/token"
                raw.append(line)
                log(line)
    finally:
        replay.set_replay(ctx.ptr, None)
        m.set_slots(SlotPlan({}), pack_host=pack_host)
        if own:
            ctx.close()
    if layers == 0:
        log("the host tier's route: not measured (no layer took a tier)")
        return RouteCost(raw=tuple(raw))
    diffs = [(a - b) / layers for a, b in zip(ms[True], ms[False])]
    route = max(float(np.median(diffs)), MIN_ROUTE_MS)
    line = f"the host tier's route: {1000 * route:.1f} us a layer ({layers} layers with a tier)"
    raw.append(line)
    log(line)
    return RouteCost(route, tuple(raw))
