"""The simulator's prediction for `moeslots bench --repick` on a big model, from a calibration: routing replayed
as the benchmark replays it (bundled traces mapped onto n_expert/k, or uniform), plan from the first
--profile-rows rows, the next --tokens simulated with the engine's re-pick rule. Prints markdown rows:
hit rate / MB uploaded per token / est. ms per token for static and each interval.

    python scripts/repick_predict.py CONFIG.toml [--experts 128 --k 8 --layers 47] [--pageable]
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import numpy as np

from moeslots.engine import bundled, replay
from moeslots.engine.calibrate import Calibration
from moeslots.profiles.plan import plan_from_counts
from moeslots.profiles.simulate import Residency, _resident_from_plan, _static, layer_counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path, help="a config.toml holding a [calibration.\"...\"] table")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--layers", type=int, default=47, help="MoE layers of the big model")
    ap.add_argument("--slots", default="19,32,64")
    ap.add_argument("--every", default="0,1,16,100,500")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--profile-rows", type=int, default=1024)
    ap.add_argument("--pageable", action="store_true", help="uploads from pageable memory (mmap'ed model)")
    ap.add_argument("--window", type=int, default=64, help="tokens whose picks elect the residents (engine: 64)")
    ap.add_argument("--decay", type=float, default=1.0,
                    help="weigh a pick decay**age within the window (a what-if; the engine counts alike: 1)")
    a = ap.parse_args()
    cal = Calibration(**next(iter(tomllib.loads(a.config.read_text())["calibration"].values())))
    cost = cal.cost_model(pinned=not a.pageable)
    E, k, moe = a.experts, a.k, list(range(1, a.layers + 1))
    print(f"uploads {cost.pcie_gbps:.1f} GB/s, CPU {cost.cpu_gbps:.1f} GB/s, base {cost.base_ms:.2f} ms, "
          f"slab {cost.slab_mb:.2f} MB ({cal.machine}, {cal.date})")
    for routing in ("code", "chat", "uniform"):
        full = (replay.uniform(a.profile_rows + a.tokens, len(moe), E, k, seed=7) if routing == "uniform"
                else replay.from_trace(bundled.profile(routing), E, k))
        col = np.array([il % full.ids.shape[1] for il in moe])
        prof, P = full.ids[:a.profile_rows][:, col], full.ids[a.profile_rows:a.profile_rows + a.tokens][:, col]
        counts = layer_counts(prof, moe, E)
        for s in (int(x) for x in a.slots.split(",")):
            init = _resident_from_plan(plan_from_counts(counts, s, moe), moe, E)
            cells = []
            for every in (int(x) for x in a.every.split(",")):
                if every:
                    hits, ups = Residency(init, s, a.window, 4, 0.25, a.decay).run(P, 0, len(P), every)
                    hr, up = hits / P.size, ups / len(P)
                else:
                    hr, up = _static(P, init)[0], 0.0
                cpu = (1 - hr) * len(moe) * k
                cells.append(f"{100 * hr:.1f} % / {up * cost.slab_mb:.1f} / "
                             f"{cost.ms_per_token(len(moe) * k - cpu, cpu, up):.1f}")
            print(f"| {routing} ({len(P)} tok) | {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
