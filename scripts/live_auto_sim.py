"""What live `--repick auto` would do on a big model, next to the fixed policies: routing replayed as
`moeslots bench --repick` replays it (bundled traces mapped onto n_expert/k, or uniform), the plan from the first
--profile-rows rows, then a session of the next --tokens. Policies: static; re-pick every 16; auto decided once at
load (choose_repick on the profile rows); live auto (that decision, then choose_repick_from every --every tokens,
as the engine does after a reply); the best fixed interval in hindsight. Cells: hit % / MB uploaded per token / est.
ms per token under a calibration; last column: live auto's decisions in order.

    python scripts/live_auto_sim.py CONFIG.toml [--pageable] [--experts 128 --k 8 --layers 47]
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import numpy as np

from moeslots.engine import bundled, replay
from moeslots.engine.calibrate import Calibration
from moeslots.profiles.plan import plan_from_counts
from moeslots.profiles.simulate import (REPICK_CHOICES, CostModel, Residency, _resident_from_plan, choose_repick,
                                        choose_repick_from, layer_counts, run_schedule)
from moeslots.profiles.trace import from_matrix


def as_trace(P: np.ndarray, layers: list[int], n_expert: int) -> "object":
    return from_matrix(P, layers, {"n_expert": str(n_expert)})


def session(P: np.ndarray, a: int, init: np.ndarray, S: int, sched: "list[tuple[int, int]]") -> tuple[float, float]:
    return run_schedule(P, a, init, S, sched, 64, 4, 0.25)


def cell(hr: float, up: float, L: int, k: int, cost: CostModel) -> tuple[str, float]:
    cpu = (1 - hr) * L * k
    ms = cost.ms_per_token(L * k - cpu, cpu, up)
    return f"{100 * hr:.1f} % / {up * cost.slab_mb:.1f} / {ms:.1f}", ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path, help="a config.toml holding a [calibration.\"...\"] table")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--layers", type=int, default=47, help="MoE layers of the big model")
    ap.add_argument("--slots", default="32,64")
    ap.add_argument("--tokens", type=int, default=1024, help="session length after the profile rows")
    ap.add_argument("--profile-rows", type=int, default=1024)
    ap.add_argument("--every", type=int, default=256, help="live auto decides after this many tokens")
    ap.add_argument("--pageable", action="store_true", help="uploads from pageable memory (mmap'ed model)")
    ap.add_argument("--mismatch", action="store_true",
                    help="the profile from the other trace (code for a chat session, chat for code): a chat that "
                    "is not what its profile recorded")
    a = ap.parse_args()
    cal = Calibration(**next(iter(tomllib.loads(a.config.read_text())["calibration"].values())))
    cost = cal.cost_model(pinned=not a.pageable)
    E, k, moe = a.experts, a.k, list(range(1, a.layers + 1))
    print(f"uploads {cost.pcie_gbps:.1f} GB/s ({'pageable' if a.pageable else 'pinned'}), CPU {cost.cpu_gbps:.1f} "
          f"GB/s, base {cost.base_ms:.2f} ms, slab {cost.slab_mb:.2f} MB ({cal.machine}, {cal.date}); "
          f"{a.layers} MoE layers x {E} experts, k {k}")
    print("| routing | slots | static | every 16 | auto at load | live auto | best fixed | live decisions |")
    print("|---|---|---|---|---|---|---|---|")
    for routing in ("chat", "code") if a.mismatch else ("chat", "code", "uniform"):
        full = (replay.uniform(a.profile_rows + a.tokens, len(moe), E, k, seed=7) if routing == "uniform"
                else replay.from_trace(bundled.profile(routing), E, k))
        col = np.array([il % full.ids.shape[1] for il in moe])
        P = full.ids[:a.profile_rows + a.tokens][:, col]
        if a.mismatch:                                   # the other trace's first rows make the profile
            other = replay.from_trace(bundled.profile("code" if routing == "chat" else "chat"), E, k)
            P = np.concatenate([other.ids[:a.profile_rows][:, col], P[a.profile_rows:]])
            routing = f"{routing} (profile: {'code' if routing == 'chat' else 'chat'})"
        p0 = a.profile_rows
        prof = as_trace(P[:p0], moe, E)
        for S in (int(x) for x in a.slots.split(",")):
            plan = plan_from_counts(layer_counts(P[:p0], moe, E), S, moe)
            init = _resident_from_plan(plan, moe, E)
            n_load, _ = choose_repick(prof, S, cost)
            # live: decide again at the end of every `every` tokens, from the plan held when they began
            sched, r, t = [(p0, n_load)], Residency(init, S, 64, 4, 0.25), p0
            n = n_load
            while t < P.shape[0]:
                end = min(P.shape[0], t + a.every)
                held = {moe[i]: tuple(int(e) for e in r.slots[i]) for i in range(len(moe))}
                r.run(P, t, end, n)
                if end - t == a.every and end < P.shape[0]:
                    n2, _ = choose_repick_from(as_trace(P[:end], moe, E), held, cost, last=a.every, current=n)
                    if n2 != n:
                        sched.append((end, n2))
                    n = n2
                t = end
            cells = {}
            for name, sch in (("static", [(p0, 0)]), ("every 16", [(p0, 16)]), ("load", [(p0, n_load)]),
                              ("live", sched)):
                cells[name] = cell(*session(P, p0, init, S, sch), len(moe), k, cost)
            best = min(((cell(*session(P, p0, init, S, [(p0, m)]), len(moe), k, cost), m)
                        for m in REPICK_CHOICES), key=lambda x: x[0][1])
            decisions = " → ".join(f"{'static' if m == 0 else m}@{t - p0}" for t, m in sched)
            print(f"| {routing} | {S} | {cells['static'][0]} | {cells['every 16'][0]} | {cells['load'][0]} "
                  f"(N={n_load}) | {cells['live'][0]} | {best[0][0]} (N={best[1]}) | {decisions} |")


if __name__ == "__main__":
    main()
