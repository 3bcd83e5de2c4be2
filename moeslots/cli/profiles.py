"""The profile commands: `moeslots record`, `profile merge`, `profile show`, `simulate` (every user error is one line,
exit code 2, via UserError)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from ..profiles import profile as prof
from ..profiles import simulate as sim
from ..profiles.costs import CostModel
from ..profiles.policy import GPU_STEPPED
from ..profiles.trace import TraceError, check_compatible, merge, read_csv, write_csv
from . import interrupts
from .common import UserError

if TYPE_CHECKING:
    from rich.console import Console


def cmd_record(a: argparse.Namespace) -> int:
    from rich.console import Console

    from ..engine.native import lib as native
    from ..engine.runtime import record as rec

    console = Console(stderr=True)
    out = Path(a.output)
    # SIGTERM / SIGHUP from the very start: one that comes while the model loads says so too (it used to end the
    # command silently there)
    with interrupts.as_interrupt(signal.SIGTERM, signal.SIGHUP):
        try:
            native.require_patched()
            with console.status("recording") as status:
                def on_progress(p: "rec.RecordProgress") -> None:
                    status.update(f"recording {p.file}: {p.tokens} decode tokens, {p.rows} routing rows so far")

                t = rec.record(Path(a.model), [Path(f) for f in a.prompt_file], out, n_decode=a.n_predict,
                               threads=a.threads, temperature=a.temperature, seed=a.seed, progress=on_progress)
        except rec.RecordInterrupted as e:
            signum = e.cause.signum if isinstance(e.cause, interrupts.Signalled) else signal.SIGINT
            what = (f"what was recorded ({e.trace.decode_tokens} decode tokens) is saved in {out}" if e.saved else
                    f"no decode token recorded yet: {out} {'left as it was' if out.exists() else 'not written'}")
            return _interrupted(console, signum, what)
        except KeyboardInterrupt as e:                       # before recording began (loading the model)
            signum = e.signum if isinstance(e, interrupts.Signalled) else signal.SIGINT
            return _interrupted(console, signum, f"before recording began: {out} "
                                f"{'left as it was' if out.exists() else 'not written'}")
    print(f"wrote {out}: {t.n_rows} rows, {t.decode_tokens} decode tokens, {(~t.decode).sum()} prompt rows, "
          f"{t.shape_text()}")
    return 0


def _interrupted(console: "Console", signum: int, what: str) -> int:
    console.print(f"interrupted ({signal.Signals(signum).name}): {what}", markup=False, highlight=False,
                  soft_wrap=True)
    return 128 + signum


def _read_trace(path: str):
    try:
        return read_csv(Path(path))
    except TraceError as e:
        raise UserError(str(e)) from None


def _check_same_model(a, b, name_a: str, name_b: str) -> None:
    try:
        check_compatible(a, b, name_a, name_b)
    except TraceError as e:
        raise UserError(str(e)) from None


def _slots_for(slots: int | None, n_expert: int, what: str) -> int:
    """--slots of the profile commands: 0..n_expert (default: a quarter of the experts)."""
    if slots is None:
        return max(1, n_expert // 4)
    if slots < 0:
        raise UserError(f"--slots takes a number >= 0 (slots per layer), not {slots}")
    if n_expert and slots > n_expert:
        raise UserError(f"--slots {slots}: {what} has {n_expert} experts per layer")
    return slots


def cmd_profile_merge(a: argparse.Namespace) -> int:
    traces = [_read_trace(p) for p in a.inputs]
    try:
        merged = merge(traces, list(a.inputs))
    except TraceError as e:
        raise UserError(str(e)) from None
    s = _slots_for(a.slots, merged.n_expert, "the merged profile")
    write_csv(merged, Path(a.output))
    print(f"wrote {a.output}: {merged.n_rows} rows, {merged.decode_tokens} decode tokens ({merged.shape_text()})")
    profs = [prof.from_trace(t, merged.n_layer, merged.n_expert) for t in traces]
    for i in range(len(profs)):
        for j in range(i + 1, len(profs)):
            ov = prof.overlap(profs[i], profs[j], s)[[il for il in range(merged.n_layer)
                                                      if profs[i].counts[il].sum() and profs[j].counts[il].sum()]]
            print(f"top-{s} overlap {a.inputs[i]} vs {a.inputs[j]}: mean {100 * ov.mean():.1f} % "
                  f"(min {100 * ov.min():.1f} %)" if ov.size else f"no common layers with data in {a.inputs[i]}, "
                                                                    f"{a.inputs[j]}")
    return 0


def cmd_profile_show(a: argparse.Namespace) -> int:
    t = _read_trace(a.profile)
    other = _read_trace(a.against) if a.against else None
    if other is not None:
        _check_same_model(t, other, a.profile, a.against)
    n_layer, n_expert = max(t.n_layer, other.n_layer if other else 0), max(t.n_expert, other.n_expert if other else 0)
    p = prof.from_trace(t, n_layer, n_expert)
    s = _slots_for(a.slots, p.n_expert, a.profile)
    print(f"{a.profile}: {t.shape_text()}, arch {t.meta.get('arch', '?')}, model {t.meta.get('model', '?')}")
    print(f"rows: {t.n_rows} ({int(t.decode.sum())} decode, {int((~t.decode).sum())} prompt); decode tokens: "
          f"{t.decode_tokens}; layers with data: {len(p.layers_with_data())}")
    sk = prof.skew(p)
    print("skew (share of decode picks in the top x % of (layer, expert) pairs): " +
          ", ".join(f"top {int(100 * k)} %: {100 * v:.1f} %" for k, v in sk.items()))
    cov = prof.coverage(p, s)
    data = p.layers_with_data()
    if data:
        print(f"coverage at {s} slots/layer (static hit rate on this profile): mean {100 * cov[data].mean():.1f} %, "
              f"min {100 * cov[data].min():.1f} % (L{data[int(cov[data].argmin())]}), "
              f"max {100 * cov[data].max():.1f} %")
    if other is not None:
        q = prof.from_trace(other, n_layer, n_expert)
        ov = prof.overlap(p, q, s)[data]
        print(f"top-{s} overlap with {a.against}: mean {100 * ov.mean():.1f} %")
    print("per-layer picks, experts sorted by count:")
    for row in prof.heatmap_rows(p, width=a.width):
        print("  " + row)
    return 0


def cmd_simulate(a: argparse.Namespace) -> int:
    test = _read_trace(a.trace)
    train = _read_trace(a.train) if a.train else None
    if train is not None:
        _check_same_model(train, test, a.train, a.trace)
    _slots_for(a.slots, max(test.n_expert, train.n_expert if train else 0), a.trace)
    if a.pcie_gbps is None:
        a.pcie_gbps = CostModel.h200(pinned=not a.pageable).pcie_gbps
    rates = {"--slab-mb": a.slab_mb, "--cpu-gbps": a.cpu_gbps, "--pcie-gbps": a.pcie_gbps, "--gpu-gbps": a.gpu_gbps,
             "--fetch-gbps": a.fetch_gbps}
    bad = [f"{k} {v}" for k, v in rates.items() if not v > 0]
    if bad or not a.base_ms >= 0:
        raise UserError("costs must be positive (base ms at least 0): " + ", ".join(bad or [f"--base-ms {a.base_ms}"]))
    if not a.share_ms >= 0:
        raise UserError(f"--share-ms must be at least 0, not {a.share_ms}")
    if (a.mechanism in GPU_STEPPED and not (a.policy and set(a.policy) <= {"hybrid", "dynamic"})
            and a.hybrid is None):
        raise UserError(f"--mechanism {a.mechanism} goes with --policy hybrid or dynamic (the tier sweep)")
    cost = CostModel(slab_mb=a.slab_mb, cpu_gbps=a.cpu_gbps, pcie_gbps=a.pcie_gbps, gpu_gbps=a.gpu_gbps,
                     base_ms=a.base_ms, fetch_gbps=a.fetch_gbps, share_ms=a.share_ms, serial_uploads=a.pageable)
    if a.union:
        try:
            u = sim.distinct_per_batch(test, a.slots, train=train, max_batch=a.union)
        except (TraceError, ValueError) as e:
            raise UserError(str(e)) from None
        print(f"{a.trace}: distinct experts computed on the CPU per layer, per batch of w decode tokens "
              f"({a.slots} slots/layer, plan from {a.train or a.trace}):")
        print("| " + " | ".join(f"w={w}" for w in u) + " |\n|" + "---|" * len(u))
        print("| " + " | ".join(f"{v:.2f}" for v in u.values()) + " |")
        return 0
    tiered = [p for p in (a.policy or []) if p in ("hybrid", "dynamic")]
    if a.hybrid is not None or tiered:
        if len(tiered) != len(a.policy or []):
            raise UserError("--policy hybrid/dynamic runs alone (the tier sweep), not with "
                            + ", ".join(p for p in a.policy if p not in tiered))
        if a.hybrid is not None and a.tier is not None:
            raise UserError("--hybrid D1,D2 is --policy hybrid --tier D1,D2: give one")
        tiers = a.hybrid if a.hybrid is not None else a.tier
        if tiered == ["dynamic"]:
            tiers = str(a.slots)
        return _simulate_hybrid(a, test, train, cost, tiers)
    if a.tier is not None:
        raise UserError("--tier goes with --policy hybrid")
    policies = a.policy or [p if p != "reelect" else f"reelect-{a.reelect_k}" for p in sim.POLICIES]
    try:
        res = sim.simulate(test, a.slots, policies, train=train, reelect_k=a.reelect_k,
                           reelect_window=a.reelect_window, cost=cost)
    except (TraceError, ValueError) as e:
        raise UserError(str(e)) from None
    print(f"{a.trace}: {test.decode_tokens} decode tokens, {test.shape_text()}; {a.slots} slots/layer; "
          f"plan trained on {a.train or a.trace}")
    print(f"cost model: slab {cost.slab_mb} MB, CPU {cost.cpu_gbps} GB/s, PCIe {cost.pcie_gbps} GB/s, "
          f"GPU {cost.gpu_gbps} GB/s, base {cost.base_ms} ms/token")
    print("| policy | hit % | MB uploaded/token | CPU experts/token | est. ms/token | est. tok/s |")
    print("|---|---|---|---|---|---|")
    for r in res:
        print(f"| {r.policy} | {100 * r.hit_rate:.1f} | {r.mb_per_token(cost):.1f} | {r.cpu_picks_per_token:.1f} | "
              f"{r.ms_per_token:.2f} | {1000 / r.ms_per_token:.1f} |")
    return 0


def _simulate_hybrid(a: argparse.Namespace, test, train, cost: CostModel, tiers_arg: str | None) -> int:
    from ..profiles import hybrid
    from ..profiles.profile import from_trace

    mech = {"engine": hybrid.ENGINE, "staged": hybrid.STAGED, "fetch": hybrid.FETCH,
            "fetch-split": hybrid.FETCH_SPLIT}.get(a.mechanism, hybrid.IDEAL)
    try:
        tiers = [int(x) for x in tiers_arg.split(",") if x.strip()] if tiers_arg else None
        layers, P = sim.token_matrix(test)
        n_expert = max(test.n_expert, int(P.max()) + 1)
        counts = from_trace(train if train is not None else test, max(layers) + 1, n_expert).counts[layers]
        res = hybrid.sweep(P, counts, a.slots, cost, tiers, mech=mech)
    except (TraceError, ValueError) as e:
        raise UserError(str(e)) from None
    print(f"{a.trace}: {len(P)} decode tokens; {a.slots} slots/layer = static core + dynamic tier; core from "
          f"{a.train or a.trace + ' (in sample: --train another trace to score out of sample)'}")
    how = {"engine": "the engine's mechanism: each token's misses split between the CPU and uploads into the tier now, "
                     "by cost, overlapped; no prefetch",
           "staged": "staged: misses on the CPU, prefetched into the tier a token later, one copy per layer in flight",
           "fetch": f"fetch (--policy fetch): the GPU steps the tier, every miss read by it at {cost.fetch_gbps} GB/s, "
                    "none on the CPU, no host round trip",
           "fetch-split": f"fetch-split (--policy fetch-split): the GPU steps the tier and reads part of each layer's "
                          f"misses at {cost.fetch_gbps} GB/s while the CPU computes the others, {cost.share_ms} ms a "
                          "layer for the split",
           }.get(a.mechanism, "ideal: misses split between CPU and uploads now by cost, "
                 + ("one after the other (pageable)" if cost.serial_uploads else "overlapped")
                 + "; prefetches resident from the next token")
    print(f"costs: slab {cost.slab_mb} MB, CPU {cost.cpu_gbps} GB/s, PCIe {cost.pcie_gbps} GB/s, GPU "
          f"{cost.gpu_gbps} GB/s, base {cost.base_ms} ms; {how}")
    print("| core + tier | policy | hit % | uploads now/token | prefetched/token | CPU experts/token | est. ms/token |")
    print("|---|---|---|---|---|---|---|")
    for r in res:
        print(f"| {a.slots - r.tier} + {r.tier} | {r.policy} | {100 * r.hit_rate:.1f} | "
              f"{r.sync_uploads_per_token:.1f} | {r.prefetch_per_token:.1f} | {r.cpu_picks_per_token:.1f} | "
              f"{r.ms_per_token:.2f} |")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("record", help="record a routing trace (profile) while the model answers prompt files")
    r.add_argument("model")
    r.add_argument("--prompt-file", action="append", required=True, help="a prompt (one chat turn); repeatable")
    r.add_argument("-n", "--n-predict", type=int, default=500, help="decode tokens per prompt")
    r.add_argument("-o", "--output", required=True)
    r.add_argument("--threads", type=int, default=None)
    r.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sample")
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(func=cmd_record)

    pr = sub.add_parser("profile", help="merge or inspect profiles")
    prs = pr.add_subparsers(dest="profile_cmd", metavar="ACTION", required=True)
    pm = prs.add_parser("merge", help="concatenate traces of one model; prints the overlap of their top sets")
    pm.add_argument("inputs", nargs="+")
    pm.add_argument("-o", "--output", required=True)
    pm.add_argument("--slots", type=int, default=None, help="slots for the overlap (default: a quarter of experts)")
    pm.set_defaults(func=cmd_profile_merge)
    ps = prs.add_parser("show", help="skew, coverage at S slots, heatmap")
    ps.add_argument("profile")
    ps.add_argument("--slots", type=int, default=None)
    ps.add_argument("--against", help="another profile: overlap of the top sets")
    ps.add_argument("--width", type=int, default=64)
    ps.set_defaults(func=cmd_profile_show)

    si = sub.add_parser("simulate", help="replay a trace through residency policies (what-if)")
    si.add_argument("trace")
    si.add_argument("--slots", type=int, required=True)
    si.add_argument("--policy", action="append", help="static-profile, static-oracle, lru, lfu-decay, reelect-K; or "
                    "alone: hybrid (a static core plus a dynamic tier, sweeping --tier) or dynamic (all slots a tier)")
    si.add_argument("--tier", metavar="D1,D2", help="--policy hybrid: dynamic slots per layer to sweep (default 0, "
                    "S/8, S/4, S/2, S)")
    si.add_argument("--mechanism", choices=["engine", "fetch", "fetch-split", "staged", "ideal"], default="engine",
                    help="--policy hybrid/dynamic: how misses reach VRAM: engine (what moeslots runs: each token's "
                    "misses split between the CPU and uploads into the tier now, by cost; default), fetch (what "
                    "--policy fetch runs: the GPU steps the tier and reads every miss itself), fetch-split (what "
                    "--policy fetch-split runs: the GPU reads part of the misses, the CPU computes the others beside "
                    "its copies), staged (CPU now, "
                    "prefetched a token later, one copy per layer in flight) or ideal (uploads now and prefetches)")
    si.add_argument("--train", help="profile the static plan is trained on (default: the trace itself)")
    si.add_argument("--reelect-k", type=int, default=16)
    si.add_argument("--reelect-window", type=int, default=64)
    h200 = CostModel()               # the defaults every estimate uses without a calibration (profiles/costs.py)
    si.add_argument("--slab-mb", type=float, default=h200.slab_mb, help="bytes of one expert (gate+up+down), MB")
    si.add_argument("--cpu-gbps", type=float, default=h200.cpu_gbps)
    si.add_argument("--pcie-gbps", type=float, default=None,
                    help="uploads (default: the H200 box's, 25.6 from pinned memory, 5.3 with --pageable)")
    si.add_argument("--pageable", action="store_true", help="the experts are mmap'ed: uploads come from pageable "
                    "memory and add to the CPU's work instead of overlapping it")
    si.add_argument("--gpu-gbps", type=float, default=h200.gpu_gbps)
    si.add_argument("--fetch-gbps", type=float, default=h200.fetch_gbps,
                    help="--mechanism fetch: the GPU reading pinned host memory itself (default: the H200 box's)")
    si.add_argument("--share-ms", type=float, default=h200.share_ms,
                    help="--mechanism fetch-split: per layer and token, the CPU share's wait and join (default: an "
                    "estimate)")
    si.add_argument("--base-ms", type=float, default=h200.base_ms, help="non-expert time per token")
    si.add_argument("--hybrid", nargs="?", const="", metavar="D1,D2", help="the same as --policy hybrid [--tier "
                    "D1,D2]")
    si.add_argument("--union", type=int, metavar="W", help="instead: distinct experts on the CPU per layer for "
                    "batches of 1..W tokens (what an MTP verify batch reads)")
    si.set_defaults(func=cmd_simulate)
