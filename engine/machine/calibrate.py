"""`moeslots doctor --calibrate MODEL`: this machine's costs, measured with the engine itself, for the simulator's
cost model (and so for `--repick auto`, `--policy auto` and the what-if line).

- upload rates (with a GPU): re-pick swaps (`cache.swap`, one slab host -> pack) from the model's host weights,
  from pageable memory (mmap, the default load) and from pinned memory (a second load without mmap: CUDA_Host),
  each as single copies (one swap timed on its own, the median: a prefetch's latency) and batched (a run of swaps
  over every layer timed as a whole: a re-pick's or a tier job's throughput). These are the copies the cache makes
  today (not copies batched through one pinned staging buffer on a copy stream, which it does not make).
- CPU expert rate and the per-token base, at each thread count up to the one asked (1, 2, 4, ..., T): static at S
  slots under routing that misses the slots and routing that hits them, the CPU's compute by the scheduler's clock
  (engine.cpu_rate).
- the host tier's route node per layer (`--policy hybrid` / `dynamic`): engine.route_cost, the host tier that
  moves nothing against static, taking turns.
- the GPU-stepped tier's upload rate and its CPU share's cost per layer (with a GPU, pinned memory; `--policy
  fetch` / `fetch-split`): engine.fetch_rates, differences of decodes with every slot a tier, the bytes counted by
  the engine.
- prompt batches (with a GPU): a 512-token prompt at S slots with the experts that are not in slots streamed to the
  GPU (llama.cpp's op-offload, batches >= 32) and computed on the CPU, from pageable and from pinned memory; the
  engine's contexts take the faster way (`prompt_path`).
- Without a GPU there is no PCIe to measure: the upload rates stay 0, `unmeasured` says so, and the cost model
  takes its defaults (profiles.costs) for them; the host-to-host copy rate is kept for information only.

Results are kept per machine (host name + GPU) in config.toml under [calibration."<machine>"].
"""

from __future__ import annotations

import dataclasses
import platform
import time
import tomllib
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ... import configfile
from ...profiles.costs import CostModel
from ..errors import EngineError
from ..llm.model import Context, LoadOptions, Model, default_threads
from ..native import expert_cache as cache
from ..native import lib as native
from ..native.expert_cache import SlotPlan
from .cpu_rate import cpu_rate
from .fetch_rates import FetchCosts, fetch_rates
from .route_cost import route_cost

VERSION = 2     # 2: a fetch-split share's costs fitted layer by layer (profiles.sharefit); the host tier's route


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
    base_ms_threads: tuple[float, ...] = ()    # ...and the base at each (empty: base_ms at every count)
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
    fetch_base_ms: float = 0.0         # a GPU-stepped tier's token apart from its copies (0: not measured)
    share_cpu_gbps: float = 0.0        # the CPU's rate on a fetch-split share beside the GPU's reads (0: not measured)
    share_overlap_ms: float = 0.0      # per layer, the GPU's own work a fetch-split share runs beside (0: none)
    route_ms: float = 0.0              # per layer, a host tier's route node beyond static (0: not measured)
    kind: str = "full"                 # "full" (doctor --calibrate) or "first-run" (engine.autocal, one thread count,
                                       # one load mode, this model's shape)
    shape: str = ""                    # the model shape it was measured on (first-run: part of its key)
    memory: str = ""                   # first-run: where the experts lived, "pinned" or "pageable" (part of its key)
    seconds: float = 0.0               # how long the measurement took
    raw: tuple[str, ...] = ()          # what was measured, one line each: a wrong pick can be explained from them
    version: int = 0                   # how it was measured: VERSION (0: before versions; a share fitted on the
                                       # token's sums, see engine.autocal.stored)

    def prompt_offload(self, *, pinned: bool) -> bool | None:
        """Whether prompt batches should stream the experts that are not in slots to the GPU (True) or compute them
        on the CPU (False); None: not measured."""
        g, c = ((self.prompt_stream_pinned_tok_s, self.prompt_cpu_pinned_tok_s) if pinned
                else (self.prompt_stream_tok_s, self.prompt_cpu_tok_s))
        return None if not (g and c) else g >= c

    def cost_model(self, slab_mb: float | None = None, *, pinned: bool = False,
                   threads: int | None = None) -> CostModel:
        """pinned: the experts live in pinned host memory (loaded without mmap); an mmap'ed model's re-pick
        copies come from pageable memory (the defaults: 5.3 GB/s, against 25.6 pinned). Unmeasured uploads (no
        GPU): the defaults' (profiles.costs).
        threads: the CPU rate measured at that thread count, when it was."""
        pcie = (self.upload_pinned_gbps if pinned else 0.0) or self.upload_pageable_gbps
        pcie = pcie or CostModel.h200(pinned=pinned).pcie_gbps
        return CostModel(slab_mb=slab_mb or self.slab_mb, cpu_gbps=self.cpu_at(threads), pcie_gbps=pcie,
                         base_ms=self.base_at(threads), fetch_gbps=self.fetch_gbps or CostModel.fetch_gbps,
                         share_ms=self.share_ms or CostModel.share_ms, fetch_base_ms=self.fetch_base_ms,
                         share_cpu_gbps=self.share_cpu_gbps, share_overlap_ms=self.share_overlap_ms,
                         route_ms=self.route_ms, serial_uploads=not pinned)

    def cpu_at(self, threads: int | None) -> float:
        """The CPU expert rate at `threads`: as measured there, else linear between the nearest thread counts
        measured below and above it (the rate grows about linearly with cores until memory bandwidth caps it),
        else the nearest one's; the calibration's own rate without a thread count."""
        return _at(threads, self.cpu_threads, self.cpu_gbps_threads, self.cpu_gbps)

    def base_at(self, threads: int | None) -> float:
        """The per-token base at `threads`, as cpu_at (base_ms where not measured by thread count)."""
        return _at(threads, self.cpu_threads, self.base_ms_threads, self.base_ms)

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
                + (f", its CPU at {self.share_cpu_gbps:.1f} GB/s" if self.share_cpu_gbps else "")
                + (f", beside {1000 * self.share_overlap_ms:.0f} us/layer of the GPU's own work"
                   if self.share_overlap_ms else "")
                + (f"; host tier's route {1000 * self.route_ms:.0f} us/layer" if self.route_ms else "")
                + (f"; GPU-stepped token {self.fetch_base_ms:.2f} ms apart from its copies" if self.fetch_base_ms
                   else "")
                + (f"; not measured: {self.unmeasured}" if self.unmeasured else "")
                + ("; measured by an earlier version (no host tier's route, fetch-split's share fitted on the "
                   "token's sums): " + ("measured again at the next first run" if self.kind == "first-run" else
                                        "run `moeslots doctor --calibrate` again") if self.version < VERSION else ""))


def _at(threads: int | None, counts: tuple[int, ...], values: tuple[float, ...], default: float) -> float:
    """A value measured at some thread counts, at `threads`: exact, else linear between the nearest counts measured
    below and above it, else the nearest one's; `default` without a thread count or values."""
    by = sorted((t, g) for t, g in zip(counts, values) if g > 0)
    if not threads or not by or len(values) != len(counts):
        return default
    lo = [(t, g) for t, g in by if t <= threads]
    hi = [(t, g) for t, g in by if t >= threads]
    if lo and hi:
        (t0, g0), (t1, g1) = lo[-1], hi[0]
        return g0 if t1 == t0 else g0 + (g1 - g0) * (threads - t0) / (t1 - t0)
    return (lo[-1] if lo else hi[0])[1]


def machine_id() -> str:
    g = native.gpus()
    return f"{platform.node() or 'host'} / {g[0].description if g else 'no GPU'}"


def entry_key(machine: str, shape: str = "", threads: int = 0, memory: str = "") -> str:
    """config.toml's key of a calibration: the machine's for a full one (doctor --calibrate), the machine's with
    the model shape, thread count and expert memory (pinned / pageable) for a first-run one (engine.autocal)."""
    return machine if not shape else f"{machine} | {shape} | {threads} threads | {memory or 'pageable'}"


def key_of(c: Calibration) -> str:
    return entry_key(c.machine, c.shape, c.threads, c.memory) if c.kind == "first-run" else c.machine


def save(c: Calibration, path: Path | None = None) -> Path:
    """Merge into config.toml (atomically), keeping every other table."""
    p = path or configfile.path()
    cfg = tomllib.loads(p.read_text(encoding="utf-8")) if p.exists() else {}
    cfg.setdefault("calibration", {})[key_of(c)] = dataclasses.asdict(c)
    return configfile.write_atomic(cfg, p)


def load(machine: str | None = None, path: Path | None = None, *, shape: str = "", threads: int = 0,
         pinned: bool = False) -> Calibration | None:
    """This machine's calibration, or None (not calibrated, or an unreadable entry). With a model shape: the
    first-run calibration of that shape at `threads` with the experts pinned or pageable when there is one, else
    the machine's full one."""
    p = path or configfile.path()
    try:
        cfg = tomllib.loads(p.read_text(encoding="utf-8")) if p.exists() else {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    table = cfg.get("calibration", {})
    if not isinstance(table, dict):
        return None
    machine = machine or machine_id()
    keys = ([entry_key(machine, shape, threads, "pinned" if pinned else "pageable")] if shape else []) + [machine]
    for k in keys:
        c = _entry(table.get(k))
        if c is not None:
            return c
    return None


def load_all(machine: str | None = None, path: Path | None = None) -> list[Calibration]:
    """Every readable calibration of this machine: the full one first, then the first-run ones."""
    p = path or configfile.path()
    try:
        table = tomllib.loads(p.read_text(encoding="utf-8")).get("calibration", {}) if p.exists() else {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []
    machine = machine or machine_id()
    found = [c for c in map(_entry, table.values() if isinstance(table, dict) else []) if c and c.machine == machine]
    return sorted(found, key=lambda c: (c.kind != "full", c.shape, c.threads, c.memory))


def _entry(d: object) -> Calibration | None:
    if not isinstance(d, dict):
        return None
    known = {f.name for f in dataclasses.fields(Calibration)}
    try:                            # (a key this version does not know, written by a later one, is left out)
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in known}
        c = Calibration(**values)
    except TypeError:
        return None
    ok = all(isinstance(getattr(c, f.name), (int, float)) for f in dataclasses.fields(c) if f.type in ("float", "int"))
    return c if ok else None


def costs_for(slab_bytes: int, *, pinned: bool, threads: int | None = None,
              shape: str = "") -> tuple[CostModel, str]:
    """The costs every estimate uses (`--repick auto`, `--policy auto`, the slots line, `bench repick`'s simulator
    column): this machine's calibration for a model of `slab_bytes` per expert (the CPU rate at `threads`; the
    first-run calibration of this model `shape` when there is one), or the defaults (profiles.costs), and a line
    saying which. pinned: the experts live in pinned host memory (loaded without mmap), else pageable."""
    slab_mb = slab_bytes / 1e6 or CostModel.slab_mb
    kind = "pinned" if pinned else "pageable (mmap)"
    cal = load(shape=shape, threads=threads or 0, pinned=pinned)
    if cal is None:
        cost = CostModel.h200(slab_mb, pinned=pinned)
        return cost, (f"default costs (H200 box, {kind} uploads at {cost.pcie_gbps} GB/s): "
                      "run `moeslots doctor --calibrate MODEL` for this machine's")
    cost = cal.cost_model(slab_mb, pinned=pinned, threads=threads)
    up = (f"{kind} uploads at {cost.pcie_gbps:.1f} GB/s" + (" (the H200 box's: not measurable here)"
                                                             if cal.unmeasured else ""))
    how = f"first-run calibration, {cal.threads} threads" if cal.kind == "first-run" else "costs calibrated"
    return cost, f"{how} on this machine {cal.date}, {up}"


def share_measured(*, shape: str = "", threads: int = 0, pinned: bool = True) -> bool:
    """Whether this machine's calibration measured the cost of a GPU-stepped tier's CPU share (`--policy fetch-split`):
    `--policy auto` considers fetch-split only then (the measurement has also run it on this machine)."""
    cal = load(shape=shape, threads=threads, pinned=pinned)
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


def upload_gbps(m: Model, moe: list[int], n_expert: int, pack_host: bool, rounds: int) -> tuple[float, float]:
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


def thread_counts(top: int) -> list[int]:
    """1, 2, 4, ... below `top`, then `top`."""
    out, t = [], 1
    while t < top:
        out.append(t)
        t *= 2
    return out + [top]


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
        pageable, pageable_1 = upload_gbps(m, moe, f.n_expert, pack_host, rounds=4)
        S = slots if slots is not None else f.n_expert // 2
        by = {t: cpu_rate(m, moe, t, n_tokens, S, pack_host, log) for t in thread_counts(top)}
        pp = (0.0, 0.0) if pack_host else _prompt_rates(m, moe, S, top, log)
        rc = route_cost(m, moe, S, top, n_tokens, pack_host, log)
    cpu_gbps, base, method = by[top]
    pinned = pinned_1 = 0.0
    fc = FetchCosts()
    pp_pinned = (0.0, 0.0)
    if not pack_host:
        log("uploads from pinned memory (model loaded without mmap)")
        with Model(model_path, LoadOptions(experts_on_host=True, use_mmap=False)) as m2:
            pinned, pinned_1 = upload_gbps(m2, moe, f.n_expert, False, rounds=4)
            cost = CostModel(slab_mb=f_slab, cpu_gbps=cpu_gbps, base_ms=base)
            fc = fetch_rates(m2, moe, S, top, n_tokens, False, log, cost)
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
                       base_ms_threads=tuple(round(v[1], 4) for v in by.values()),
                       upload_pageable_single_gbps=pageable_1, upload_pinned_single_gbps=pinned_1,
                       fetch_gbps=fc.gbps, share_ms=fc.share_ms, fetch_base_ms=fc.base_ms,
                       share_cpu_gbps=fc.share_cpu_gbps, share_overlap_ms=fc.share_overlap_ms,
                       route_ms=rc.route_ms, raw=rc.raw + fc.raw, version=VERSION,
                       host_copy_gbps=host, unmeasured=unmeasured, prompt_stream_tok_s=pp[0], prompt_cpu_tok_s=pp[1],
                       prompt_stream_pinned_tok_s=pp_pinned[0], prompt_cpu_pinned_tok_s=pp_pinned[1])
