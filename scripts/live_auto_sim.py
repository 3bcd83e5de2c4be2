"""What live `--repick auto` would do on a big model, next to the fixed policies: routing replayed as
`moeslots bench repick` replays it (bundled traces mapped onto n_expert/k, or uniform), the plan from the first
--profile-rows rows, then a session of the next --tokens. Policies: static; re-pick every 16; auto decided once at
load (choose_repick on the profile rows); live auto (that decision, then choose_repick_from every --every tokens,
as the engine does after a reply); the best fixed interval in hindsight. Cells: hit % / MB uploaded per token / est.
ms per token under a calibration; last column: live auto's decisions in order.

    python scripts/live_auto_sim.py CONFIG.toml [--pageable] [--experts 128 --k 8 --layers 47]
"""

from __future__ import annotations

import argparse

import bigshape  # scripts/bigshape.py: the shape, costs and routing both scripts use
import numpy as np

from moeslots.profiles.plan import plan_from_counts
from moeslots.profiles.repick import REPICK_CHOICES, Picks, choose_repick, choose_repick_from
from moeslots.profiles.simulate import Residency, layer_counts, resident_from_plan, run_schedule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bigshape.add_args(ap)
    ap.add_argument("--slots", default="32,64")
    ap.add_argument("--tokens", type=int, default=1024, help="session length after the profile rows")
    ap.add_argument("--every", type=int, default=256, help="live auto decides after this many tokens")
    ap.add_argument("--mismatch", action="store_true",
                    help="the profile from the other trace (code for a chat session, chat for code): a chat that "
                    "is not what its profile recorded")
    a = ap.parse_args()
    cost, moe = bigshape.setup(a)
    E, p0 = a.experts, a.profile_rows
    print("| routing | slots | static | every 16 | auto at load | live auto | best fixed | live decisions |")
    print("|---|---|---|---|---|---|---|---|")
    for routing in ("chat", "code") if a.mismatch else ("chat", "code", "uniform"):
        P = bigshape.picks(routing, p0 + a.tokens, a, moe)
        if a.mismatch:                                   # the other trace's first rows make the profile
            other = "code" if routing == "chat" else "chat"
            P = np.concatenate([bigshape.picks(other, p0, a, moe), P[p0:]])
            routing = f"{routing} (profile: {other})"
        T = P.shape[0]
        for S in (int(x) for x in a.slots.split(",")):
            init = resident_from_plan(plan_from_counts(layer_counts(P[:p0], moe, E), S, moe), moe, E)
            n_load, _ = choose_repick(Picks(P[:p0], moe, E), S, cost)
            # live: decide again after every `every` tokens, from the plan held when they began (as the engine)
            sched, r, n = [(p0, n_load)], Residency(init, S, 64, 4, 0.25), n_load
            for t in range(p0, T, a.every):
                end = min(T, t + a.every)
                held = {moe[i]: tuple(int(e) for e in r.slots[i]) for i in range(len(moe))}
                r.advance(P, t, end, n)
                if end - t == a.every and end < T:
                    n2, _ = choose_repick_from(Picks(P[:end], moe, E), held, cost, last=a.every, current=n)
                    if n2 != n:
                        sched.append((end, n2))
                        r.since, n = 0, n2
            cells = {m: bigshape.cell(*run_schedule(P, p0, init, S, [(p0, m)], 64, 4, 0.25), moe, a.k, cost)
                     for m in REPICK_CHOICES}                            # every fixed interval, static (0) included
            live = bigshape.cell(*run_schedule(P, p0, init, S, sched, 64, 4, 0.25), moe, a.k, cost)
            static, every16, load = cells[0], cells[16], cells[n_load]
            best_n = min(cells, key=lambda m: cells[m][1])
            best = cells[best_n]
            decisions = " → ".join(f"{'static' if m == 0 else m}@{t - p0}" for t, m in sched)
            print(f"| {routing} | {S} | {static[0]} | {every16[0]} | {load[0]} (N={n_load}) | {live[0]} | "
                  f"{best[0]} (N={best_n}) | {decisions} |")


if __name__ == "__main__":
    main()
