"""What `--policy fetch-split` (the GPU-stepped tier with the CPU computing a share of each layer's misses beside the
GPU's copies: profiles.hybrid.FETCH_SPLIT, the engine's rule) is predicted to give over `--policy fetch`, for three
values of its per-layer cost share_ms (not yet measured on a GPU: 87 us, the old split's round trip; 40 us, the cost
model's estimate; 20 us), on the cells of the H200 side-by-side run: the 30B-A3B shape (48 layers, 128 experts,
k 8, 2.654 MB per expert), uniform random rows and the routing donor's sampled chat trace, plans from the first
1,024 rows, 64 rows scored after 16 more, 32 and 64 slots,
the H200 box's costs at 16 and 6 threads, tiers S/4, S/2 and S (the best shown), each beside llama.cpp's cache as
measured in that run (docs/lab/2026-12-04-h200-fetch-tier.md).
Run from the repository root with the project's Python: .venv/bin/python scripts/sim/fetch-split-whatif.py
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from moeslots.engine.native import replay
from moeslots.profiles.costs import CostModel
from moeslots.profiles.hybrid import FETCH, FETCH_SPLIT, Mechanism, core_and_tier, simulate_hybrid
from moeslots.profiles.simulate import layer_counts

L, E, K, SLAB_MB = 48, 128, 8, 2.654208
DONOR = Path("profiles/data/moeslots-donor-qwen3-30b-a3b-chat-sampled.npz")
LLAMA = {(16, "random", 32): 44.2, (16, "random", 64): 55.2, (16, "donor chat", 32): 51.2,
         (16, "donor chat", 64): 72.2, (6, "random", 32): 44.0, (6, "random", 64): 55.2,
         (6, "donor chat", 32): 49.5, (6, "donor chat", 64): 70.2}
CPU_GBPS = {16: 63.4, 6: 31.1}


def best(rows: np.ndarray, counts: np.ndarray, slots: int, cost: CostModel, mech: Mechanism) -> tuple[float, int]:
    """(tok/s, tier) of the best tier among S/4, S/2, S: rows = 4 warm-up rows, then the scored ones."""
    out = []
    for d in sorted({slots // 4, slots // 2, slots}):
        core, first = core_and_tier(counts, slots, d)
        r = simulate_hybrid(rows, core, d, cost, initial=first, mech=mech, warmup=4)
        out.append((1000 / r.ms_per_token, d))
    return max(out)


def main() -> None:
    moe = list(range(L))
    print("| threads | routing | slots | llama.cpp cache | fetch (sim) | fetch-split, share_ms 0.087 | 0.040 | 0.020 |"
          "\n|---|---|---|---|---|---|---|---|")
    for routing in ("random", "donor chat"):
        full = (replay.uniform(1024 + 64 + 16, L, E, K, seed=7) if routing == "random"
                else replay.from_trace(DONOR, E, K))
        P = full.per_layer(moe)
        counts = layer_counts(P[:1024], moe, E)
        rows = P[1024 + 12:1024 + 16 + 64]
        for threads in (16, 6):
            cost = CostModel(slab_mb=SLAB_MB, cpu_gbps=CPU_GBPS[threads], pcie_gbps=26.8, base_ms=8.8)
            for slots in (32, 64):
                ref = LLAMA[threads, routing, slots]
                cells = [best(rows, counts, slots, cost, FETCH)] + [
                    best(rows, counts, slots, dataclasses.replace(cost, share_ms=ms), FETCH_SPLIT)
                    for ms in (0.087, 0.040, 0.020)]
                print(f"| {threads} | {routing} | {slots} | {ref} | " + " | ".join(
                    f"{v:.1f} ({v / ref:.2f}×, tier {d})" for v, d in cells) + " |")


if __name__ == "__main__":
    main()
