"""The simulator's prediction for `moeslots bench repick` on a big model, from a calibration: routing replayed
as the benchmark replays it (bundled traces mapped onto n_expert/k, or uniform), plan from the first
--profile-rows rows, the next --tokens simulated with the engine's re-pick rule. Prints markdown rows:
hit rate / MB uploaded per token / est. ms per token for static and each interval.

    python scripts/repick_predict.py CONFIG.toml [--experts 128 --k 8 --layers 47] [--pageable]
"""

from __future__ import annotations

import argparse

import bigshape  # scripts/bigshape.py: the shape, costs and routing both scripts use

from moeslots.profiles.plan import plan_from_counts
from moeslots.profiles.simulate import Residency, layer_counts, resident_from_plan, static_hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bigshape.add_args(ap)
    ap.add_argument("--slots", default="19,32,64")
    ap.add_argument("--every", default="0,1,16,100,500")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--window", type=int, default=64, help="tokens whose picks elect the residents (engine: 64)")
    ap.add_argument("--decay", type=float, default=1.0,
                    help="weigh a pick decay**age within the window (a what-if; the engine counts alike: 1)")
    a = ap.parse_args()
    cost, moe = bigshape.setup(a)
    E = a.experts
    for routing in ("code", "chat", "uniform"):
        rows = bigshape.picks(routing, a.profile_rows + a.tokens, a, moe)
        prof, P = rows[:a.profile_rows], rows[a.profile_rows:]
        counts = layer_counts(prof, moe, E)
        for s in (int(x) for x in a.slots.split(",")):
            init = resident_from_plan(plan_from_counts(counts, s, moe), moe, E)
            cells = []
            for every in (int(x) for x in a.every.split(",")):
                if every:
                    hits, ups = Residency(init, s, a.window, 4, 0.25, a.decay).advance(P, 0, len(P), every)
                    hr, up = hits / P.size, ups / len(P)
                else:
                    hr, up = static_hits(P, init)[0], 0.0
                cells.append(bigshape.cell(hr, up, moe, a.k, cost)[0])
            print(f"| {routing} ({len(P)} tok) | {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
