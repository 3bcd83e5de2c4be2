"""Markdown table from `moeslots bench repick ... --json` files: one row per (routing, slots, policy), one column
per run, each cell "tok/s (mean ms/token / the simulator's ms/token)". The simulator's ms/token is recomputed from
the row's simulated hits and uploads with the calibration given (pinned or pageable rate per run, as the run
loaded the model), so runs made before the calibration compare on the same costs.

    python scripts/repick_table.py CONFIG.toml NAME=RUN.json [NAME=RUN.json ...] [--moe-layers N]

Hit rates and MB per token come from the first run holding the row (replays are deterministic; overlapped runs
differ and belong in a table of their own). JSONs written before the bench recorded its MoE layer count need
--moe-layers (47 for the realistic-shape synthetic of docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from pathlib import Path

from moeslots.engine.machine.calibrate import Calibration


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path, help="a config.toml holding a [calibration.\"...\"] table")
    ap.add_argument("runs", nargs="+", help="column name = bench JSON")
    ap.add_argument("--moe-layers", type=int, help="MoE layers of the model, for JSONs that do not say")
    a = ap.parse_args()
    cal = Calibration(**next(iter(tomllib.loads(a.config.read_text())["calibration"].values())))
    names, cells, facts = [], {}, {}
    for spec in a.runs:
        name, _, path = spec.partition("=")
        d = json.loads(Path(path).read_text())
        cost = cal.cost_model(d["info"]["cost"]["slab_mb"], pinned=not d["info"]["mmap"])
        names.append(name)
        for r in d["rows"]:
            if r["scheduler_mb_per_token"] > 0:
                raise SystemExit(f"{path}: the scheduler copied weights ({r['scheduler_mb_per_token']} MB/token)")
            key = (re.sub(r"[\w.-]*-(\w+)", r"\1", r["routing"]), r["slots"], r["every"])   # "...-chat" -> chat
            n_moe = d["info"].get("n_moe") or a.moe_layers
            if not n_moe:
                raise SystemExit(f"{path}: the JSON does not say how many MoE layers the model has: --moe-layers")
            L_k = d["info"]["k"] * n_moe                                    # picks per token
            cpu = (1 - r["sim_hit_rate"]) * L_k
            sim = cost.ms_per_token(L_k - cpu, cpu, r["sim_mb_per_token"] / cost.slab_mb)
            cells[key, name] = f"{r['decode_tok_s']:.1f} ({1000 / r['decode_tok_s']:.1f} / {sim:.1f})"
            facts.setdefault(key, f"{100 * r['hit_rate']:.1f} ({100 * r['sim_hit_rate']:.1f}) | "
                                  f"{r['mb_moved_per_token']:.1f}")
    print("| routing | slots | policy | hit % (sim) | MB up/token | " + " | ".join(names) + " |")
    print("|---|---|---|---|---|" + "---|" * len(names))
    for key in sorted(facts, key=lambda k: (k[0], k[1], k[2] if k[2] >= 0 else 1 << 30)):   # live auto last
        pol = "static" if key[2] == 0 else "auto (live)" if key[2] < 0 else f"re-pick {key[2]}"
        print(f"| {key[0]} | {key[1]} | {pol} | {facts[key]} | "
              + " | ".join(cells.get((key, n), "—") for n in names) + " |")


if __name__ == "__main__":
    main()
