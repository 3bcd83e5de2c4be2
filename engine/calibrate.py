"""`moeslots doctor --calibrate MODEL`: this machine's costs, measured with the engine itself, for the simulator's
cost model (and so for `--repick auto`, `--policy auto` and the what-if line).

- upload rates (with a GPU): re-pick swaps (`cache.swap`, one slab host -> pack) from the model's host weights,
  from pageable memory (mmap, the default load) and from pinned memory (a second load without mmap: CUDA_Host),
  each as single copies (one swap timed on its own, the median: a prefetch's latency) and batched (a run of swaps
  over every layer timed as a whole: a re-pick's or a tier job's throughput). Batched copies through one pinned
  staging buffer on a copy stream are the cache rewrite's (issue 18); these are the copies the cache makes today.
- CPU expert rate and the per-token base, at each thread count up to the one asked (1, 2, 4, ..., T): decode with
  uniform replayed routing at 0 slots and at S slots; the picks moved to the GPU are exactly known from the native
  stats, so cpu_gbps = (CPU bytes/token at 0 - at S) / (t0 - tS) and base_ms = t0 - CPU bytes at 0 / cpu_gbps.
  Without a GPU (hot packs in host memory) both chains run on the CPU and t0 ~ tS: the rate is then the 0-slot
  routed bytes over the whole token time (a lower bound), and the result says so.
- the GPU-stepped tier's upload rate (with a GPU, pinned memory; `--policy fetch`): decode with uniform replayed
  routing and every slot a tier at S and at S/2 slots; the bytes the tier copied per token are counted by the engine,
  so fetch_gbps = (bytes/token at S/2 - at S) / (t(S/2) - t(S)). Then the CPU share's cost per layer (`--policy
  fetch-split`): the same S/2 decode with a CPU share whose CPU is so dear that no miss goes to it (every miss still
  copied, the counts say so), so share_ms = (t(share) - t(S/2)) / layers: the wait and join each layer adds.
- prompt batches (with a GPU): a 512-token prompt at S slots with the experts that are not in slots streamed to the
  GPU (llama.cpp's op-offload, batches >= 32) and computed on the CPU, from pageable and from pinned memory; the
  engine's contexts take the faster way (`prompt_path`).
- Without a GPU there is no PCIe to measure: the upload rates stay 0, `unmeasured` says so, and the cost model
  takes the H200 box's (profiles.costs) for them; the host-to-host copy rate is kept for information only.

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
from .cache import CacheError, SlotPlan
from .errors import EngineError
from .model import Context, LoadOptions, Model, default_threads
from .native_tier import NativeTier, TierCounts


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
    threads: int = 0                   # the thread count cpu_gbps and base_ms were measured at (0: not recorded)
    cpu_threads: tuple[int, ...] = ()  # CPU expert rate by thread count: these counts...
    cpu_gbps_threads: tuple[float, ...] = ()   # ...and the rate at each
    upload_pageable_single_gbps: float = 0.0   # one slab at a time (median); the fields above: batched
    upload_pinned_single_gbps: float = 0.0
    fetch_gbps: float = 0.0            # the GPU reading pinned host memory itself (a GPU-stepped tier); 0: not measured
    share_ms: float = 0.0              # a GPU-stepped tier's CPU share: per layer and token (0: not measured)
    host_copy_gbps: float = 0.0        # no GPU: the host-to-host pack copies (information, not PCIe)
    unmeasured: str = ""               # what this machine could not measure, and what the costs use instead
    # a 512-token prompt at the calibration's S slots (tok/s; 0: not measured): the experts not in slots streamed to
    # the GPU (op-offload) or computed on the CPU, the model mmap'ed (pageable) or in pinned memory
    prompt_stream_tok_s: float = 0.0
    prompt_cpu_tok_s: float = 0.0
    prompt_stream_pinned_tok_s: float = 0.0
    prompt_cpu_pinned_tok_s: float = 0.0

    def prompt_offload(self, *, pinned: bool) -> bool | None:
        """Whether prompt batches should stream the experts that are not in slots to the GPU (True) or compute them
        on the CPU (False); None: not measured."""
        g, c = ((self.prompt_stream_pinned_tok_s, self.prompt_cpu_pinned_tok_s) if pinned
                else (self.prompt_stream_tok_s, self.prompt_cpu_tok_s))
        return None if not (g and c) else g >= c

    def cost_model(self, slab_mb: float | None = None, *, pinned: bool = False,
                   threads: int | None = None) -> CostModel:
        """pinned: the experts live in pinned host memory (loaded without mmap); an mmap'ed model's re-pick
        copies come from pageable memory (4x slower on the H200 box). Unmeasured uploads (no GPU): the H200 box's.
        threads: the CPU rate measured at that thread count, when it was."""
        pcie = (self.upload_pinned_gbps if pinned else 0.0) or self.upload_pageable_gbps
        pcie = pcie or CostModel.h200(pinned=pinned).pcie_gbps
        cpu = dict(zip(self.cpu_threads, self.cpu_gbps_threads)).get(threads or 0, 0.0) or self.cpu_gbps
        return CostModel(slab_mb=slab_mb or self.slab_mb, cpu_gbps=cpu, pcie_gbps=pcie, base_ms=self.base_ms,
                         fetch_gbps=self.fetch_gbps or CostModel.fetch_gbps,
                         share_ms=self.share_ms or CostModel.share_ms)

    def render(self) -> str:
        up = [f"{v:.1f} GB/s {what}" for v, what in (
            (self.upload_pinned_gbps, "pinned batched"), (self.upload_pinned_single_gbps, "pinned single"),
            (self.upload_pageable_gbps, "pageable batched"), (self.upload_pageable_single_gbps, "pageable single"),
            (self.fetch_gbps, "read by the GPU (--policy fetch)"))
            if v]
        by = ", ".join(f"{t}: {g:.1f}" for t, g in zip(self.cpu_threads, self.cpu_gbps_threads))
        return (f"{self.machine}: uploads {'; '.join(up) or 'not measured'}; CPU experts {self.cpu_gbps:.1f} GB/s"
                f"{f' at {self.threads} threads' if self.threads else ''}{f' (by threads {by})' if by else ''}; "
                f"base {self.base_ms:.2f} ms/token ({self.method}; model {self.model}, slab {self.slab_mb:.2f} MB, "
                f"{self.date})" + (f"; host copies {self.host_copy_gbps:.1f} GB/s" if self.host_copy_gbps else "")
                + (f"; prompt 512 streamed/CPU: {self.prompt_stream_tok_s:.0f}/{self.prompt_cpu_tok_s:.0f} tok/s "
                   f"pageable, {self.prompt_stream_pinned_tok_s:.0f}/{self.prompt_cpu_pinned_tok_s:.0f} pinned"
                   if self.prompt_stream_tok_s else "")
                + (f"; CPU share {1000 * self.share_ms:.0f} us/layer (--policy fetch-split)" if self.share_ms else "")
                + (f"; not measured: {self.unmeasured}" if self.unmeasured else ""))


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
        if not isinstance(d, dict):
            return None
        c = Calibration(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
        ok = all(isinstance(getattr(c, f.name), (int, float)) for f in dataclasses.fields(c)
                 if f.type in ("float", "int"))
        return c if ok else None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, TypeError):
        return None


def costs_for(slab_bytes: int, *, pinned: bool, threads: int | None = None) -> tuple[CostModel, str]:
    """The costs every estimate uses (`--repick auto`, `--policy auto`, the slots line, `bench repick`'s simulator
    column): this machine's calibration for a model of `slab_bytes` per expert (the CPU rate at `threads` when
    measured), or the H200 box's (profiles.costs), and a line saying which. pinned: the experts live in pinned host
    memory (loaded without mmap), else pageable."""
    slab_mb = slab_bytes / 1e6 or CostModel.slab_mb
    kind = "pinned" if pinned else "pageable (mmap)"
    cal = load()
    if cal is None:
        cost = CostModel.h200(slab_mb, pinned=pinned)
        return cost, (f"default costs (H200 box, {kind} uploads at {cost.pcie_gbps} GB/s): "
                      "run `moeslots doctor --calibrate MODEL` for this machine's")
    cost = cal.cost_model(slab_mb, pinned=pinned, threads=threads)
    up = (f"{kind} uploads at {cost.pcie_gbps:.1f} GB/s" + (" (the H200 box's: not measurable here)"
                                                             if cal.unmeasured else ""))
    return cost, f"costs calibrated on this machine {cal.date}, {up}"


def share_measured() -> bool:
    """Whether this machine's calibration measured the cost of a GPU-stepped tier's CPU share (`--policy fetch-split`):
    `--policy auto` considers fetch-split only then (the measurement has also run it on this machine)."""
    cal = load()
    return cal is not None and cal.share_ms > 0


def prompt_path(*, pinned: bool) -> tuple[bool, str]:
    """(op_offload for the engine's context, the line that says why): the way this machine's calibration measured
    faster for prompt batches' experts that are not in slots; llama.cpp's default (streamed) when not measured."""
    cal = load()
    choice = cal.prompt_offload(pinned=pinned) if cal else None
    if choice is None:
        return True, ""
    c = cal
    assert c is not None
    g, p = ((c.prompt_stream_pinned_tok_s, c.prompt_cpu_pinned_tok_s) if pinned else
            (c.prompt_stream_tok_s, c.prompt_cpu_tok_s))
    how = "streamed to the GPU" if choice else "computed on the CPU"
    return choice, (f"prompts: experts not in slots {how} (calibrated: {g:.0f} tok/s streamed, {p:.0f} on the CPU, "
                    f"{'pinned' if pinned else 'pageable'} memory)")


def _prompt_rates(m: Model, moe: list[int], S: int, threads: int, log: Callable[[str], None],
                  n_tokens: int = 512, pack_host: bool = False) -> tuple[float, float]:
    """A prompt of n_tokens at S slots per layer, (streamed, on the CPU) tok/s: the second of two runs each.
    pack_host: packs in host memory (no GPU: both ways compute on the CPU)."""
    m.set_slots(SlotPlan({il: tuple(range(S)) for il in moe} if S else {}), pack_host=pack_host)
    toks = [int(t) for t in np.random.default_rng(2).integers(0, m.n_vocab - 16, n_tokens)]
    out = []
    try:
        for offload in (True, False):
            with Context(m, n_ctx=n_tokens + 16, n_batch=n_tokens, threads=threads, op_offload=offload) as ctx:
                dt = 0.0
                for _ in range(2):
                    ctx.reset()
                    t0 = time.perf_counter()
                    ctx.decode(toks, prompt=True)
                    dt = time.perf_counter() - t0
            out.append(n_tokens / dt if dt > 0 else 0.0)
            log(f"prompt {n_tokens} at {S} slots, experts not in slots {'streamed' if offload else 'on the CPU'}: "
                f"{out[-1]:.0f} tok/s")
    finally:
        m.set_slots(SlotPlan({}), pack_host=pack_host)
    return out[0], out[1]


def _upload_gbps(m: Model, moe: list[int], n_expert: int, pack_host: bool, rounds: int) -> tuple[float, float]:
    """Swaps of slot 0 cycling through non-resident experts: (batched: `rounds` swaps per layer timed as a whole,
    single: the median of swaps timed one by one), GB/s."""
    m.set_slots(SlotPlan({il: (0,) for il in moe}), pack_host=pack_host)
    nbytes = 0
    t0 = time.perf_counter()
    for r in range(rounds):
        for il in moe:
            nbytes += cache.swap(m.ptr, il, 0, 1 + r % (n_expert - 1))
    dt = time.perf_counter() - t0
    one = []
    for r in range(rounds):
        for il in moe:
            t1 = time.perf_counter()
            n = cache.swap(m.ptr, il, 0, 1 + (r + rounds) % (n_expert - 1))
            if n:
                one.append(n / (time.perf_counter() - t1))
    m.set_slots(SlotPlan({}), pack_host=pack_host)
    return (nbytes / dt / 1e9 if dt > 0 else 0.0), (float(np.median(one)) / 1e9 if one else 0.0)


def _decode_ms(ctx: Context, toks: list[int]) -> float:
    """The median ms of one-token decodes of toks, one after the other."""
    per = []
    for t in toks:
        t1 = time.perf_counter()
        ctx.decode([t])
        per.append(time.perf_counter() - t1)
    return float(np.median(per)) * 1e3


def _fetch_rates(m: Model, moe: list[int], S: int, threads: int, n_tokens: int, pack_host: bool,
                 log: Callable[[str], None]) -> tuple[float, float]:
    """The GPU-stepped tier's uploads (GB/s) and its CPU share's cost per layer (ms), 0 where not measurable: decode
    at S and S/2 slots per layer, every slot a tier, under uniform replayed routing (the difference in bytes copied
    per token over the difference in time); then S/2 again with a CPU share that leaves the CPU nothing (a CPU cost
    a million times a copy's), whose extra time per token over the layers is the share's own cost."""
    f = m.facts
    sizes = sorted({s for s in (S, S // 2) if f.n_expert_used <= s < f.n_expert}, reverse=True)
    if len(sizes) < 2:
        return 0.0, 0.0
    toks = [int(t) for t in np.random.default_rng(3).integers(0, m.n_vocab - 16, n_tokens + 9)]
    dear_cpu = dataclasses.replace(CostModel(), cpu_gbps=CostModel.fetch_gbps * 1e-6)
    res = []
    with Context(m, n_ctx=n_tokens + 64, threads=threads) as ctx:
        replay.set_replay(ctx.ptr, replay.uniform(4096, len(moe), f.n_expert, f.n_expert_used, seed=4))
        for s, share in [(sizes[0], False), (sizes[1], False), (sizes[1], True)]:
            plan = SlotPlan({il: tuple(range(s)) for il in moe})
            m.set_slots(plan, pack_host=pack_host)
            ctx.reset()
            ctx.decode(toks[:8], prompt=True)
            try:
                tier = NativeTier(m.ptr, plan, s, dear_cpu, device=True, share=share)
            except CacheError as e:                         # this device cannot step it: not measured
                log(f"GPU-stepped tier: {e}")
                m.set_slots(SlotPlan({}), pack_host=pack_host)
                return (0.0, 0.0) if not share else (_rate(res), 0.0)
            try:
                ctx.decode([toks[8]])                       # graphs for this configuration
                tier.step(force=True)
                tier.counts = TierCounts()
                ms = _decode_ms(ctx, toks[9:])
                tier.step(0, force=True)
                res.append((ms, tier.counts.bytes / len(toks[9:]) / 1e6, tier.counts.cpu))
            finally:
                tier.close()
            log(f"GPU-stepped tier{' with a CPU share' if share else ''}, {s} slots: {res[-1][0]:.2f} ms/token, "
                f"{res[-1][1]:.1f} MB copied/token")
        replay.set_replay(ctx.ptr, None)
    m.set_slots(SlotPlan({}), pack_host=pack_host)
    (tb, mb, _), (tc, mc, cpu) = res[1], res[2]
    # the share's run must have copied what the plain run copied and left nothing to the CPU
    share = (tc - tb) / len(moe) if tc > tb and cpu == 0 and abs(mc - mb) <= 1e-9 + 1e-6 * mb else 0.0
    return _rate(res), share


def _rate(res: list[tuple[float, float, int]]) -> float:
    (ta, ma, _), (tb, mb, _) = res[0], res[1]            # more slots first: fewer bytes, less time
    return (mb - ma) / (tb - ta) if tb > ta and mb > ma else 0.0     # MB/ms = GB/s


def thread_counts(top: int) -> list[int]:
    """1, 2, 4, ... below `top`, then `top`."""
    out, t = [], 1
    while t < top:
        out.append(t)
        t *= 2
    return out + [top]


def _cpu_rate(m: Model, moe: list[int], threads: int, n_tokens: int, S: int, pack_host: bool,
              log: Callable[[str], None]) -> tuple[float, float, str]:
    """(CPU expert GB/s, base ms/token, method) at `threads`, from 0 vs S slots under uniform replayed routing."""
    f = m.facts
    f_slab = f.slab_bytes / 1e6
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
            ms = _decode_ms(ctx, toks[9:])
            st = ctx.read_stats()
            misses = float(st.misses.sum()) / len(toks[9:])
            res[s] = (ms, misses)
            log(f"{threads} threads, {s} slots: {res[s][0]:.2f} ms/token, {misses:.1f} CPU picks/token")
        m.set_slots(SlotPlan({}), pack_host=pack_host)
    finally:
        ctx.close()
    (t0, c0), (ts, cs) = res[0], res[S]
    cpu_mb_0 = c0 * f_slab
    if not pack_host and t0 - ts > 0.05 * t0 and c0 > cs:
        cpu_gbps = (c0 - cs) * f_slab / (t0 - ts)            # MB/ms = GB/s
        return cpu_gbps, max(0.0, t0 - cpu_mb_0 / cpu_gbps), "split"
    return (cpu_mb_0 / t0 if t0 > 0 else 0.0), 0.0, ("cpu-only lower bound" if pack_host
                                                      else "lower bound (no measurable gain from slots)")


def run(model_path: Path, *, threads: int | None = None, n_tokens: int = 32, slots: int | None = None,
        log: Callable[[str], None] = print) -> Calibration:
    pack_host = not native.gpus()
    top = threads or default_threads()
    with Model(model_path, LoadOptions(experts_on_host=True, extra_bufts=not pack_host)) as m:
        f = m.facts
        moe = [il for il in f.moe_layers if il < f.n_layer]
        if not moe:
            raise EngineError(f"{model_path} has no MoE layers to calibrate with")
        f_slab = f.slab_bytes / 1e6
        log("host-to-host pack copies (no GPU: not PCIe)" if pack_host else "uploads from pageable memory (mmap)")
        pageable, pageable_1 = _upload_gbps(m, moe, f.n_expert, pack_host, rounds=4)
        S = slots if slots is not None else f.n_expert // 2
        by = {t: _cpu_rate(m, moe, t, n_tokens, S, pack_host, log) for t in thread_counts(top)}
        pp = (0.0, 0.0) if pack_host else _prompt_rates(m, moe, S, top, log)
    cpu_gbps, base, method = by[top]
    pinned = pinned_1 = fetch = share = 0.0
    pp_pinned = (0.0, 0.0)
    if not pack_host:
        log("uploads from pinned memory (model loaded without mmap)")
        with Model(model_path, LoadOptions(experts_on_host=True, use_mmap=False)) as m2:
            pinned, pinned_1 = _upload_gbps(m2, moe, f.n_expert, False, rounds=4)
            fetch, share = _fetch_rates(m2, moe, S, top, n_tokens, False, log)
            pp_pinned = _prompt_rates(m2, moe, S, top, log)
    host = 0.0
    unmeasured = ""
    if pack_host:
        host, pageable, pageable_1 = pageable, 0.0, 0.0
        h = CostModel.h200()
        unmeasured = (f"PCIe uploads and the GPU's rate (no GPU); the costs use the H200 box's: uploads "
                      f"{h.pcie_gbps} GB/s pinned, {CostModel.h200(pinned=False).pcie_gbps} GB/s pageable "
                      f"(profiles/costs.py); the CPU rate is a lower bound")
    return Calibration(machine=machine_id(), date=time.strftime("%Y-%m-%d"), model=Path(model_path).name,
                       slab_mb=f_slab, upload_pageable_gbps=pageable, upload_pinned_gbps=pinned,
                       cpu_gbps=cpu_gbps, base_ms=base, method=method, threads=top,
                       cpu_threads=tuple(by), cpu_gbps_threads=tuple(round(v[0], 3) for v in by.values()),
                       upload_pageable_single_gbps=pageable_1, upload_pinned_single_gbps=pinned_1, fetch_gbps=fetch,
                       share_ms=share,
                       host_copy_gbps=host, unmeasured=unmeasured, prompt_stream_tok_s=pp[0], prompt_cpu_tok_s=pp[1],
                       prompt_stream_pinned_tok_s=pp_pinned[0], prompt_cpu_pinned_tok_s=pp_pinned[1])
