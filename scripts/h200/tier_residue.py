"""Whether a tier leaves something behind that slows the static cache after it: static decode timed alone, then
after a GPU-stepped tier (fetch-split, then fetch) ran and closed in the same process and context, with each
thread's CPU time over one idle second after each (a thread that spins while nothing decodes shows there) and the
process's thread count. With ROUNDS > 0, then that many rounds of static, static, a GPU-stepped tier (fetch-split
and fetch in turn), static: each reading after a tier against the reading right before it, beside two consecutive
readings with nothing between them (how far static moves by itself), their medians and quartiles. Paired readings
cancel the machine's drift; "within ±3 %" is a question for these medians. Usage (the 30B-A3B shape, experts
pinned): python3 -P scripts/h200/tier_residue.py MODEL.gguf [THREADS] [SLOTS] [ROUNDS]"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.machine.fetch_rates import decode_ms
from moeslots.engine.native import lib as native
from moeslots.engine.native import replay
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.native.tier import NativeTier
from moeslots.profiles.costs import CostModel


def threads_cpu() -> dict[str, float]:
    """CPU seconds per thread of this process (name/tid)."""
    out = {}
    hz = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        f = stat.rsplit(")", 1)[1].split()
        out[f"{name}/{tid}"] = (int(f[11]) + int(f[12])) / hz
    return out


def idle(label: str) -> None:
    a = threads_cpu()
    time.sleep(1.0)
    b = threads_cpu()
    busy = {k: b[k] - a.get(k, 0.0) for k in b if b[k] - a.get(k, 0.0) > 0.02}
    print(f"idle second after {label}: {len(b)} threads; busy: "
          + (", ".join(f"{k} {v:.2f} s" for k, v in sorted(busy.items())) or "none"), flush=True)


def rounds(n: int, static: Callable[[str], float], tier: Callable[[bool], None]) -> None:
    """n rounds of static, static, a tier (fetch-split and fetch in turn), static; the paired ratios' medians."""
    if n < 1:
        return
    alone, after = [], []
    for r in range(n):
        a = static(f"round {r + 1}, first")
        b = static(f"round {r + 1}, second")
        tier(r % 2 == 0)
        c = static(f"round {r + 1}, after the tier")
        alone.append(b / a)
        after.append(c / b)
    for name, v in (("static after static", alone), ("static after a tier", after)):
        q1, med, q3 = np.percentile(v, [25, 50, 75])
        print(f"{name}, against the reading before it, {n} rounds: median {100 * (med - 1):+.1f} %, "
              f"quartiles {100 * (q1 - 1):+.1f} to {100 * (q3 - 1):+.1f} %", flush=True)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = Path(sys.argv[1])
    try:
        threads = int(sys.argv[2]) if len(sys.argv) > 2 else 16
        S = int(sys.argv[3]) if len(sys.argv) > 3 else 64
        n_rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    except ValueError:
        sys.exit("tier_residue.py: THREADS, SLOTS and ROUNDS are whole numbers")
    if threads < 1 or S < 1 or n_rounds < 0:
        sys.exit("tier_residue.py: THREADS and SLOTS must be positive, ROUNDS 0 or more")
    pack = not native.gpus()            # no GPU: the packs in host memory (a check that the script runs, no more)
    with Model(path, LoadOptions(experts_on_host=True, use_mmap=False)) as m:
        f = m.facts
        moe = [il for il in f.moe_layers if il < f.n_layer]
        toks = [int(t) for t in np.random.default_rng(0).integers(0, m.n_vocab - 16, 64)]
        plan = SlotPlan({il: tuple(range(S)) for il in moe})
        with Context(m, n_ctx=128, threads=threads) as ctx:
            replay.set_replay(ctx.ptr, replay.uniform(4096, len(moe), f.n_expert, f.n_expert_used, seed=4))

            def static(label: str, fresh: bool = False) -> float:
                if fresh:                                  # every pack freed first: built anew from nothing
                    m.set_slots(SlotPlan({}), pack_host=pack)
                m.set_slots(plan, pack_host=pack)
                ctx.reset()
                ctx.decode(toks[:8], prompt=True)
                ctx.decode([toks[8]])
                ms = decode_ms(ctx, toks[9:57])
                print(f"static {S} slots, {threads} threads, {label}: {ms:.2f} ms/token", flush=True)
                return ms

            def tier(share: bool, device: bool = True) -> None:
                m.set_slots(plan, pack_host=pack)
                ctx.reset()
                ctx.decode(toks[:8], prompt=True)
                t = NativeTier(m.ptr, plan, S // 2, CostModel(slab_mb=f.slab_bytes / 1e6), device=device, share=share)
                try:
                    ms = decode_ms(ctx, toks[8:56])
                finally:
                    t.close()
                name = ("fetch-split" if share else "fetch") if device else "hybrid"
                print(f"{name} {S - S // 2} + {S // 2}: {ms:.2f} ms/token", flush=True)

            idle("load")
            static("alone")
            static("alone, again")
            idle("static")
            tier(True)
            idle("fetch-split")
            static("after fetch-split")
            tier(False)
            idle("fetch")
            static("after fetch")
            static("after fetch, packs freed and built anew", fresh=True)
            tier(False, device=False)
            static("after hybrid")
            rounds(n_rounds, static, tier)
            replay.set_replay(ctx.ptr, None)
        with Context(m, n_ctx=128, threads=threads) as ctx2:
            replay.set_replay(ctx2.ptr, replay.uniform(4096, len(moe), f.n_expert, f.n_expert_used, seed=4))
            m.set_slots(plan, pack_host=pack)
            ctx2.decode(toks[:8], prompt=True)
            ctx2.decode([toks[8]])
            print(f"static {S} slots, {threads} threads, a new context after both: "
                  f"{decode_ms(ctx2, toks[9:57]):.2f} ms/token", flush=True)
            replay.set_replay(ctx2.ptr, None)


if __name__ == "__main__":
    main()
