"""`moeslots doctor --calibrate MODEL`: this machine's costs, measured with the engine itself, for the simulator's
cost model (and so for `--repick auto` / the what-if line).

- upload rate: re-pick swaps (`cache.swap`, one slab host -> pack) timed from the model's host weights, from
  pageable memory (mmap, the default load) and from pinned memory (a second load without mmap: CUDA_Host);
- CPU expert rate and the per-token base: decode with uniform replayed routing at 0 slots and at S slots; the
  picks moved to the GPU are exactly known from the native stats, so
  cpu_gbps = (CPU bytes/token at 0 - at S) / (t0 - tS) and base_ms = t0 - CPU bytes at 0 / cpu_gbps.
  Without a GPU (hot packs in host memory) both chains run on the CPU and t0 ~ tS: the rate is then the 0-slot
  routed bytes over the whole token time (a lower bound), and the result says so.

Results are kept per machine (host name + GPU) in config.toml under [calibration."<machine>"].
"""

from __future__ import annotations

import dataclasses
import platform
import time
import tomllib
from pathlib import Path
from typing import Callable

import numpy as np

from .. import configfile
from ..profiles.costs import CostModel
from . import cache, native, replay
from . import stats as stats_mod
from .cache import SlotPlan
from .errors import EngineError
from .model import Context, LoadOptions, Model


@dataclasses.dataclass(frozen=True)
class Calibration:
    machine: str
    date: str
    model: str
    slab_mb: float
    upload_pageable_gbps: float
    upload_pinned_gbps: float          # 0: not measured (no GPU)
    cpu_gbps: float
    base_ms: float
    method: str                        # "split" (GPU) or "cpu-only lower bound"

    def cost_model(self, slab_mb: float | None = None, *, pinned: bool = False) -> CostModel:
        """pinned: the experts live in pinned host memory (loaded without mmap); an mmap'ed model's re-pick
        copies come from pageable memory (4x slower on the H200 box)."""
        pcie = (self.upload_pinned_gbps if pinned else 0.0) or self.upload_pageable_gbps
        return CostModel(slab_mb=slab_mb or self.slab_mb, cpu_gbps=self.cpu_gbps, pcie_gbps=pcie,
                         base_ms=self.base_ms)

    def render(self) -> str:
        pinned = f"{self.upload_pinned_gbps:.1f} GB/s pinned, " if self.upload_pinned_gbps else ""
        return (f"{self.machine}: uploads {pinned}{self.upload_pageable_gbps:.1f} GB/s pageable; CPU experts "
                f"{self.cpu_gbps:.1f} GB/s; base {self.base_ms:.2f} ms/token ({self.method}; model {self.model}, "
                f"slab {self.slab_mb:.2f} MB, {self.date})")


def machine_id() -> str:
    g = native.gpus()
    return f"{platform.node() or 'host'} / {g[0].description if g else 'no GPU'}"


def save(c: Calibration, path: Path | None = None) -> Path:
    """Merge into config.toml (atomically), keeping every other table."""
    p = path or configfile.path()
    cfg = tomllib.loads(p.read_text(encoding="utf-8")) if p.exists() else {}
    cfg.setdefault("calibration", {})[c.machine] = dataclasses.asdict(c)
    return configfile.write_atomic(cfg, p)


def load(machine: str | None = None, path: Path | None = None) -> Calibration | None:
    """This machine's calibration, or None (not calibrated, or an unreadable entry)."""
    p = path or configfile.path()
    try:
        cfg = tomllib.loads(p.read_text(encoding="utf-8")) if p.exists() else {}
        d = cfg.get("calibration", {}).get(machine or machine_id())
        return Calibration(**d) if isinstance(d, dict) else None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, TypeError):
        return None


def costs_for(slab_bytes: int, *, pinned: bool) -> tuple[CostModel, str]:
    """The costs every estimate uses (`--repick auto`, the slots line, `bench repick`'s simulator column): this
    machine's calibration for a model of `slab_bytes` per expert, or the H200 box's (profiles.costs), and a line
    saying which. pinned: the experts live in pinned host memory (loaded without mmap), else pageable."""
    slab_mb = slab_bytes / 1e6 or CostModel.slab_mb
    kind = "pinned" if pinned else "pageable (mmap)"
    cal = load()
    if cal is None:
        cost = CostModel.h200(slab_mb, pinned=pinned)
        return cost, (f"default costs (H200 box, {kind} uploads at {cost.pcie_gbps} GB/s): "
                      "run `moeslots doctor --calibrate MODEL` for this machine's")
    cost = cal.cost_model(slab_mb, pinned=pinned)
    return cost, f"costs calibrated on this machine {cal.date}, {kind} uploads at {cost.pcie_gbps:.1f} GB/s"


def _upload_gbps(m: Model, moe: list[int], n_expert: int, pack_host: bool, rounds: int) -> float:
    """Time `rounds` swaps per layer of slot 0 (cycling through non-resident experts)."""
    m.set_slots(SlotPlan({il: (0,) for il in moe}), pack_host=pack_host)
    nbytes = 0
    t0 = time.perf_counter()
    for r in range(rounds):
        for il in moe:
            nbytes += cache.swap(m.ptr, il, 0, 1 + r % (n_expert - 1))
    dt = time.perf_counter() - t0
    m.set_slots(SlotPlan({}), pack_host=pack_host)
    return nbytes / dt / 1e9 if dt > 0 else 0.0


def run(model_path: Path, *, threads: int | None = None, n_tokens: int = 32, slots: int | None = None,
        log: Callable[[str], None] = print) -> Calibration:
    pack_host = not native.gpus()
    f_slab = 0.0
    with Model(model_path, LoadOptions(experts_on_host=True, extra_bufts=not pack_host)) as m:
        f = m.facts
        moe = [il for il in f.moe_layers if il < f.n_layer]
        if not moe:
            raise EngineError(f"{model_path} has no MoE layers to calibrate with")
        f_slab = f.slab_bytes / 1e6
        log("uploads from pageable memory (mmap)")
        pageable = _upload_gbps(m, moe, f.n_expert, pack_host, rounds=4)
        S = slots if slots is not None else f.n_expert // 2
        ctx = Context(m, n_ctx=n_tokens + 64, threads=threads)
        try:
            ctx.enable_stats(ring_rows=0)
            replay.set_replay(ctx.ptr, replay.uniform(4096, len(moe), f.n_expert, f.n_expert_used, seed=1))
            rng = np.random.default_rng(0)
            toks = [int(t) for t in rng.integers(0, m.n_vocab - 16, n_tokens + 8)]
            res: dict[int, tuple[float, float]] = {}
            for s in (0, S, 0, S):                        # twice each, interleaved: keep the second (warm) pass
                m.set_slots(SlotPlan({il: tuple(range(s)) for il in moe} if s else {}), pack_host=pack_host)
                ctx.reset()
                ctx.decode(toks[:8], prompt=True)
                ctx.decode([toks[8]])                     # graphs for this configuration
                stats_mod.reset(ctx.ptr)
                per = []
                for t in toks[9:]:
                    t1 = time.perf_counter()
                    ctx.decode([t])
                    per.append(time.perf_counter() - t1)
                st = ctx.read_stats()
                misses = float(st.misses.sum()) / len(per)
                res[s] = (float(np.median(per)) * 1e3, misses)
                log(f"{s} slots: {res[s][0]:.2f} ms/token, {misses:.1f} CPU picks/token")
            m.set_slots(SlotPlan({}), pack_host=pack_host)
        finally:
            ctx.close()
    (t0, c0), (ts, cs) = res[0], res[S]
    cpu_mb_0 = c0 * f_slab
    if not pack_host and t0 - ts > 0.05 * t0 and c0 > cs:
        cpu_gbps = (c0 - cs) * f_slab / (t0 - ts)            # MB/ms = GB/s
        base = max(0.0, t0 - cpu_mb_0 / cpu_gbps)
        method = "split"
    else:
        cpu_gbps = cpu_mb_0 / t0 if t0 > 0 else 0.0
        base = 0.0
        method = "cpu-only lower bound" if pack_host else "lower bound (no measurable gain from slots)"
    pinned = 0.0
    if not pack_host:
        log("uploads from pinned memory (model loaded without mmap)")
        with Model(model_path, LoadOptions(experts_on_host=True, use_mmap=False)) as m2:
            pinned = _upload_gbps(m2, moe, f.n_expert, False, rounds=4)
    return Calibration(machine=machine_id(), date=time.strftime("%Y-%m-%d"), model=Path(model_path).name,
                       slab_mb=f_slab, upload_pageable_gbps=pageable, upload_pinned_gbps=pinned,
                       cpu_gbps=cpu_gbps, base_ms=base, method=method)
