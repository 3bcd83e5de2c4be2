"""How a layer's misses are split between uploads (or a GPU-stepped tier's copies) and the CPU, by this machine's
costs, and what a GPU-stepped tier's layers cost: the arithmetic the simulator (profiles.hybrid) and the engine's tiers
(engine.native_tier, patches 0007/0008) share, so both split every layer alike."""

from __future__ import annotations

import math

import numpy as np

from .costs import CostModel


def best_split(misses: int, t_cpu: float, t_up: float, room: int) -> int:
    """How many of `misses` to upload now (at most `room`) so that max(uploads * t_up, CPU picks * t_cpu) is least."""
    if misses <= 0 or room <= 0:
        return 0
    u = misses * t_cpu / (t_cpu + t_up)
    cands = {0, min(room, misses), min(room, math.floor(u)), min(room, math.ceil(u))}
    return min(cands, key=lambda n: (max(n * t_up, (misses - n) * t_cpu), n))


def share_costs(cost: CostModel) -> tuple[float, float]:
    """A GPU-stepped tier's CPU share: one expert computed on the CPU and one copied by the GPU, in ms (what the
    engine is given: engine.native_tier)."""
    return cost.slab_mb / cost.share_cpu, cost.slab_mb / cost.fetch_gbps


def share_ratio(cost: CostModel) -> float:
    """The cost of a miss computed on the CPU over one the GPU copies, as the engine holds it (a float32: the fetch
    node's parameter, from share_costs)."""
    t_cpu, t_fetch = share_costs(cost)
    return float(np.float32(t_cpu / t_fetch))


def share_copies(misses: int, ratio: float, room: int) -> int:
    """How many of a layer's misses a GPU-stepped tier with a CPU share copies: best_split with the CPU at `ratio`
    and a copy at 1 (the fetch node's arithmetic), the fewest on ties."""
    return best_split(misses, ratio, 1.0, room)


def fetch_layers_ms(cost: CostModel, up: np.ndarray, c: np.ndarray, share: bool) -> float:
    """A GPU-stepped tier's layers beyond its fixed part: per layer its copies (up) at the GPU's fetch rate; with a
    CPU share (c misses on the CPU) the larger of the copies plus the GPU's own work beside the share
    (share_overlap_ms, in the fixed part already) and the CPU part, less that work, plus the share's wait and join."""
    t_share, t_fetch = share_costs(cost)
    if not share:
        return float(up.sum()) * t_fetch
    y = cost.share_overlap_ms
    return float(np.sum(np.maximum(up * t_fetch + y, c * t_share) - y + cost.share_ms))


def expert_ms(cost: CostModel) -> tuple[float, float]:
    """One expert computed on the CPU and one uploaded, in ms."""
    return cost.slab_mb / cost.cpu_gbps, cost.slab_mb / cost.pcie_gbps


NEVER = 1e9     # rule_costs' weight of the side a serial split never takes


def rule_costs(cost: CostModel, serial: bool | None = None) -> tuple[float, float]:
    """The two weights best_split divides a layer's misses by (the engine's tier gets these same numbers:
    engine.native_tier): expert_ms where uploads overlap the CPU's work. Where they add to it (serial; None:
    cost.serial_uploads) the least sum is all or nothing: every miss the tier has room for when an upload costs less
    than a CPU expert, else none, which best_split gives from weights (NEVER, 1) and (1, NEVER)."""
    t_cpu, t_up = expert_ms(cost)
    if not (cost.serial_uploads if serial is None else serial):
        return t_cpu, t_up
    return (NEVER, 1.0) if t_up < t_cpu else (1.0, NEVER)
