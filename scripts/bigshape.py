"""What scripts/repick_predict.py and scripts/live_auto_sim.py share: the big model's shape and a calibration's
costs from the command line, routing replayed onto that shape as `moeslots bench repick` replays it, and the
"hit % / MB uploaded per token / est. ms per token" cell."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import numpy as np

from moeslots.engine.machine import bundled
from moeslots.engine.machine.calibrate import Calibration
from moeslots.engine.native import replay
from moeslots.profiles.costs import CostModel


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("config", type=Path, help="a config.toml holding a [calibration.\"...\"] table")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--layers", type=int, default=47, help="MoE layers of the big model")
    ap.add_argument("--profile-rows", type=int, default=1024, help="trace rows that make the static plan")
    ap.add_argument("--pageable", action="store_true", help="uploads from pageable memory (mmap'ed model)")


def setup(a: argparse.Namespace) -> tuple[CostModel, list[int]]:
    """The calibration's costs (pinned or pageable uploads) and the MoE layers 1..--layers; prints both."""
    cal = Calibration(**next(iter(tomllib.loads(a.config.read_text())["calibration"].values())))
    cost = cal.cost_model(pinned=not a.pageable)
    print(f"uploads {cost.pcie_gbps:.1f} GB/s ({'pageable' if a.pageable else 'pinned'}), CPU {cost.cpu_gbps:.1f} "
          f"GB/s, base {cost.base_ms:.2f} ms, slab {cost.slab_mb:.2f} MB ({cal.machine}, {cal.date}); "
          f"{a.layers} MoE layers x {a.experts} experts, k {a.k}")
    return cost, list(range(1, a.layers + 1))


def picks(routing: str, n_rows: int, a: argparse.Namespace, moe: list[int]) -> np.ndarray:
    """[n_rows, len(moe), k] picks: a bundled trace ("code", "chat") mapped onto --experts/--k, or "uniform"."""
    table = (replay.uniform(n_rows, len(moe), a.experts, a.k, seed=7) if routing == "uniform"
             else replay.from_trace(bundled.profile(routing), a.experts, a.k))
    return table.per_layer(moe)[:n_rows]


def cell(hr: float, up: float, moe: list[int], k: int, cost: CostModel) -> tuple[str, float]:
    """hit rate and slabs uploaded per token -> ("hit % / MB per token / ms per token", ms per token)."""
    picks_per_token = len(moe) * k
    cpu = (1 - hr) * picks_per_token
    ms = cost.ms_per_token(picks_per_token - cpu, cpu, up)
    return f"{100 * hr:.1f} % / {up * cost.slab_mb:.1f} / {ms:.1f}", ms
