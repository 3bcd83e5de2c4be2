"""The profile commands of the command line: `moeslots record`, `profile merge`, `profile show`, `simulate` (split
out of moeslots.cli; the same rules: every user error is one line, exit code 2, via cli.UserError)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from moeslots.cli import UserError


def cmd_record(a: argparse.Namespace) -> int:
    from rich.console import Console

    from moeslots import interrupts
    from moeslots.engine import native
    from moeslots.engine import record as rec

    native.require_patched()
    console = Console(stderr=True)
    out = Path(a.output)
    with console.status("recording") as status, interrupts.as_interrupt(signal.SIGTERM, signal.SIGHUP):
        def on_progress(p: "rec.RecordProgress") -> None:
            status.update(f"recording {p.file}: {p.tokens} decode tokens, {p.rows} routing rows so far")

        try:
            t = rec.record(Path(a.model), [Path(f) for f in a.prompt_file], out, n_decode=a.n_predict,
                           threads=a.threads, temperature=a.temperature, seed=a.seed, progress=on_progress)
        except rec.RecordInterrupted as e:
            signum = e.cause.signum if isinstance(e.cause, interrupts.Signalled) else signal.SIGINT
            what = (f"what was recorded ({e.trace.decode_tokens} decode tokens) is saved in {out}" if e.saved else
                    f"no decode token recorded yet: {out} {'left as it was' if out.exists() else 'not written'}")
            console.print(f"interrupted ({signal.Signals(signum).name}): {what}", markup=False, highlight=False,
                          soft_wrap=True)
            return 128 + signum
    print(f"wrote {out}: {t.n_rows} rows, {t.decode_tokens} decode tokens, {(~t.decode).sum()} prompt rows, "
          f"{t.shape_text()}")
    return 0


def _read_trace(path: str):  # noqa: ANN202
    from moeslots.profiles.trace import TraceError, read_csv

    try:
        return read_csv(Path(path))
    except TraceError as e:
        raise UserError(str(e)) from None


def _check_same_model(a, b, name_a: str, name_b: str) -> None:  # noqa: ANN001
    from moeslots.profiles.trace import TraceError, check_compatible

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
    from moeslots.profiles import profile as prof
    from moeslots.profiles.trace import TraceError, merge, write_csv

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
    from moeslots.profiles import profile as prof

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
              f"min {100 * cov[data].min():.1f} % (L{data[int(cov[data].argmin())]}), max {100 * cov[data].max():.1f} %")
    if other is not None:
        q = prof.from_trace(other, n_layer, n_expert)
        ov = prof.overlap(p, q, s)[data]
        print(f"top-{s} overlap with {a.against}: mean {100 * ov.mean():.1f} %")
    print("per-layer picks, experts sorted by count:")
    for row in prof.heatmap_rows(p, width=a.width):
        print("  " + row)
    return 0


def cmd_simulate(a: argparse.Namespace) -> int:
    from moeslots.profiles import simulate as sim
    from moeslots.profiles.trace import TraceError

    test = _read_trace(a.trace)
    train = _read_trace(a.train) if a.train else None
    if train is not None:
        _check_same_model(train, test, a.train, a.trace)
    _slots_for(a.slots, max(test.n_expert, train.n_expert if train else 0), a.trace)
    cost = sim.CostModel(slab_mb=a.slab_mb, cpu_gbps=a.cpu_gbps, pcie_gbps=a.pcie_gbps, gpu_gbps=a.gpu_gbps,
                         base_ms=a.base_ms)
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
