"""How fetch-split's speed depends on its split: the CPU's share of each layer's misses follows the CPU rate the cost
model gives it (share_cpu_gbps); this times fetch-split with that rate scaled by each FACTOR (a larger rate gives the
CPU more misses), beside fetch (no CPU share), under the scheduler's clock, after one first-run calibration per thread
count. Random-token routing (a uniform replay table), experts pinned. Usage:
    python3 -P scripts/h200/split_sweep.py MODEL.gguf [THREADS,...] [SLOTS] [FACTOR,...]"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.machine import autocal
from moeslots.engine.native import replay
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.native.tier import NativeTier

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layer_trace import HEADER, row, timed  # noqa: E402


def main() -> None:
    path = Path(sys.argv[1])
    thread_counts = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "16,6").split(",")]
    S = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    factors = [float(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "0.25,0.5,1,2,4").split(",")]
    n = 48
    with Model(path, LoadOptions(experts_on_host=True, use_mmap=False)) as m:
        f = m.facts
        moe = [il for il in f.moe_layers if il < f.n_layer]
        toks = [int(x) for x in np.random.default_rng(0).integers(0, m.n_vocab - 16, n + 16)]
        plan = SlotPlan({il: tuple(range(S)) for il in moe})
        for threads in thread_counts:
            c = autocal.run(m, threads=threads, slots=S, pack_host=False, log=lambda s: None)
            base = c.cost_model(f.slab_bytes / 1e6, pinned=True, threads=threads)
            rate = base.share_cpu_gbps or base.cpu_gbps
            print(f"calibration at {threads} threads: CPU {c.cpu_gbps:.1f} GB/s, share CPU {c.share_cpu_gbps:.1f}, "
                  f"fetch {c.fetch_gbps:.1f} GB/s; the split's CPU rate {rate:.1f} GB/s", flush=True)
            print(HEADER + "\n" + "|---" * 15 + "|", flush=True)
            with Context(m, n_ctx=n + 64, threads=threads) as ctx:
                replay.set_replay(ctx.ptr, replay.uniform(4096, len(moe), f.n_expert, f.n_expert_used, seed=4))
                for order in (factors, factors[::-1]):
                    for k in [0.0, *order]:
                        m.set_slots(plan, pack_host=False)
                        ctx.reset()
                        ctx.decode(toks[:8], prompt=True)
                        cost = dataclasses.replace(base, share_cpu_gbps=rate * k) if k else base
                        tier = NativeTier(m.ptr, plan, S // 2, cost, device=True, share=k > 0)
                        try:
                            ctx.decode(toks[8:12])
                            d = timed(ctx, toks[12:12 + n])
                            tier.step(0, force=True)
                            cpu = tier.counts.cpu / (n + 4)
                        finally:
                            tier.close()
                        what = f"fetch-split x{k:g} ({cpu:.0f} CPU misses/token)" if k else "fetch"
                        print(row(threads, S, what, d, len(moe)), flush=True)
                replay.set_replay(ctx.ptr, None)


if __name__ == "__main__":
    main()
