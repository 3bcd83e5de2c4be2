"""The routing analysis of docs/profiles.md on the routing donor's traces: locality, skew, hit-rate curves
of the residency policies, workload overlap. Markdown on stdout.

    .venv/bin/python scripts/train/donor_analysis.py [PREFIX] [--slots 13,32,64,96] [--quick]

PREFIX: the traces are PREFIX-{code,chat,prose}-{greedy,sampled}.npz (default: the kept ones,
profiles/data/moeslots-donor-qwen3-30b-a3b). Hit rates are scored on the second half of a trace (replies to other
prompts than the first half's) and every static plan is out of sample: from the first half (same workload), from the
other decode mode's trace (same workload), from the other workloads' sampled traces merged. Re-elect starts from the
first-half plan; the hybrid policy (profiles/hybrid.py, the engine's mechanism: uploads now, no prefetch) gets a core
of 3/4 of the slots from it and a dynamic tier of the other 1/4. Costs: the default cost model (the H200 box, a
3.06 MB slab: Qwen3-30B-A3B at Q4_K_M) for MB uploaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from moeslots.profiles import hybrid
from moeslots.profiles.costs import CostModel
from moeslots.profiles.locality import layer_skew, locality
from moeslots.profiles.profile import from_trace, overlap
from moeslots.profiles.simulate import simulate, token_matrix
from moeslots.profiles.trace import Trace, merge, read_csv

WORKLOADS = ("code", "chat", "prose")
MODES = ("greedy", "sampled")


def load(prefix: str) -> dict[tuple[str, str], Trace]:
    return {(w, m): read_csv(Path(f"{prefix}-{w}-{m}.npz")) for w in WORKLOADS for m in MODES
            if Path(f"{prefix}-{w}-{m}.npz").exists()}


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def traces_table(tr: dict[tuple[str, str], Trace], prefix: str) -> None:
    print("| trace | decode tokens | prompt rows | prompts | file KiB |\n|---|---|---|---|---|")
    for (w, m), t in tr.items():
        size = Path(f"{prefix}-{w}-{m}.npz").stat().st_size / 1024
        print(f"| {w}-{m} | {t.decode_tokens} | {int((~t.decode).sum())} | {t.meta.get('prompts', '?')} | "
              f"{size:.0f} |")


def locality_table(tr: dict[tuple[str, str], Trace]) -> None:
    print("| trace | reused within 1 | within 8 | within 64 | median / p90 reuse distance | first picks % | "
          "distinct experts per layer in 8 / 64 tokens |\n|---|---|---|---|---|---|---|")
    t = None
    for (w, m), t in tr.items():
        _, P = token_matrix(t)
        loc = locality(P, t.n_expert)
        print(f"| {w}-{m} | {pct(loc.overlap[1])} | {pct(loc.overlap[8])} | {pct(loc.overlap[64])} | "
              f"{loc.median_reuse:.0f} / {loc.p90_reuse:.0f} | {pct(loc.never_reused)} | "
              f"{loc.working_set[8]:.1f} / {loc.working_set[64]:.1f} |")
    if t is not None:                          # k of n uniformly at random: geometric reuse distances
        q = 1 - t.k / t.n_expert
        u = {w: 1 - q ** w for w in (1, 8, 64)}
        med, p90 = (int(np.ceil(np.log(x) / np.log(q))) for x in (0.5, 0.1))
        print(f"| *uniform random routing* | {pct(u[1])} | {pct(u[8])} | {pct(u[64])} | {med} / {p90} | "
              f"— | {t.n_expert * u[8]:.1f} / {t.n_expert * u[64]:.1f} |")


def skew_table(tr: dict[tuple[str, str], Trace]) -> None:
    print("| trace | top 10 % of experts (13): mean, min (layer), max (layer) | top 25 % (32): mean | "
          "effective experts (of 128): mean, min (layer) |\n|---|---|---|---|")
    for (w, m), t in tr.items():
        layers, P = token_matrix(t)
        counts = np.stack([np.bincount(P[:, j].ravel(), minlength=t.n_expert) for j in range(len(layers))])
        s = layer_skew(counts)
        t10, e = s["top10"], s["effective"]
        print(f"| {w}-{m} | {pct(t10.mean())}, {pct(t10.min())} (L{layers[int(t10.argmin())]}), "
              f"{pct(t10.max())} (L{layers[int(t10.argmax())]}) | {pct(s['top25'].mean())} | "
              f"{e.mean():.0f}, {e.min():.0f} (L{layers[int(e.argmin())]}) |")


def half(t: Trace, first: bool) -> Trace:
    """The rows before (first) or from the middle decode row on: two recordings of other prompts, same workload."""
    d = np.flatnonzero(t.decode)
    cut = d[len(d) // 2]
    sel = np.arange(t.n_rows) < cut if first else np.arange(t.n_rows) >= cut
    return Trace(t.pos[sel], t.layer[sel], t.ids[sel], t.meta)


def other_plan(tr: dict[tuple[str, str], Trace], w: str, m: str) -> Trace | None:
    return tr.get((w, "sampled" if m == "greedy" else "greedy"))


def wrong_plan(tr: dict[tuple[str, str], Trace], w: str) -> Trace | None:
    others = [tr[(o, "sampled")] for o in WORKLOADS if o != w and (o, "sampled") in tr]
    return merge(others, [f"{o}-sampled" for o in WORKLOADS if o != w]) if others else None


def curves(tr: dict[tuple[str, str], Trace], slots: list[int], cost: CostModel, quick: bool) -> None:
    """Each trace's second half (other prompts than its first half) scored; every plan out of sample: the first
    half's (same workload), the other decode mode's trace (same workload), the other workloads' sampled traces."""
    print("Hit % of decode picks on the second half of each trace (MB uploaded per token for the dynamic ones):\n")
    for (w, m), full in tr.items():
        if quick and m == "greedy":
            continue
        t, first, mode, wrong = half(full, False), half(full, True), other_plan(tr, w, m), wrong_plan(tr, w)
        other = "sampled" if m == "greedy" else "greedy"
        print(f"**{w}-{m}**, tokens {full.decode_tokens // 2}.. ({t.decode_tokens} tokens):\n")
        print(f"| slots | static: first-half plan | static: {w}-{other} plan | static: other workloads' plan | "
              "static-oracle | lru | lfu-decay | reelect-16 | reelect-64 | hybrid (core 3/4 + tier 1/4) |\n"
              "|---|---|---|---|---|---|---|---|---|---|")
        layers, P = token_matrix(t)
        for s in slots:
            pol = ["static-profile", "static-oracle", "lru", "lfu-decay", "reelect-16", "reelect-64"]
            r = {x.policy: x for x in simulate(t, s, pol, train=first, cost=cost)}

            def static(src: Trace | None) -> str:
                return pct(simulate(t, s, ["static-profile"], train=src, cost=cost)[0].hit_rate) if src else "—"

            counts = from_trace(first, max(max(layers) + 1, first.n_layer), t.n_expert).counts[layers]
            hy = hybrid.sweep(P, counts, s, cost, tiers=[s // 4], mech=hybrid.ENGINE)[0]

            def dyn(x: str) -> str:
                return f"{pct(r[x].hit_rate)} ({r[x].mb_per_token(cost):.0f})"

            print(f"| {s} ({100 * s / t.n_expert:.0f} %) | {pct(r['static-profile'].hit_rate)} | {static(mode)} | "
                  f"{static(wrong)} | {pct(r['static-oracle'].hit_rate)} | {dyn('lru')} | {dyn('lfu-decay')} | "
                  f"{dyn('reelect-16')} | {dyn('reelect-64')} | {pct(hy.hit_rate)} "
                  f"({(hy.sync_uploads_per_token + hy.prefetch_per_token) * cost.slab_mb:.0f}) |", flush=True)
        print()


def overlap_table(tr: dict[tuple[str, str], Trace], slots: list[int]) -> None:
    def prof(t: Trace):  # type: ignore[no-untyped-def]
        return from_trace(t, t.n_layer, t.n_expert)

    print("| pair | " + " | ".join(f"top-{s}" for s in slots) + " |\n|---|" + "---|" * len(slots))
    print("| *chance* | " + " | ".join(pct(s / 128) for s in slots) + " |")
    pairs = [(a, b) for i, a in enumerate(WORKLOADS) for b in WORKLOADS[i + 1:]]
    for a, b in pairs:
        ta, tb = tr.get((a, "sampled")), tr.get((b, "sampled"))
        if ta is None or tb is None:
            continue
        row = [pct(overlap(prof(ta), prof(tb), s)[:48].mean()) for s in slots]
        print(f"| {a} vs {b} (sampled) | " + " | ".join(row) + " |")
    for w in WORKLOADS:
        if (w, "greedy") in tr and (w, "sampled") in tr:
            row = [pct(overlap(prof(tr[(w, "greedy")]), prof(tr[(w, "sampled")]), s)[:48].mean()) for s in slots]
            print(f"| {w}: greedy vs sampled | " + " | ".join(row) + " |")
        if (w, "sampled") in tr:
            t = tr[(w, "sampled")]
            row = [pct(overlap(prof(half(t, True)), prof(half(t, False)), s)[:48].mean()) for s in slots]
            print(f"| {w}-sampled: first vs second half (noise floor) | " + " | ".join(row) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prefix", nargs="?", default="profiles/data/moeslots-donor-qwen3-30b-a3b")
    ap.add_argument("--slots", default="13,32,64,96")
    ap.add_argument("--quick", action="store_true", help="hit-rate curves of the sampled traces only")
    a = ap.parse_args()
    tr = load(a.prefix)
    if not tr:
        sys.exit(f"no traces {a.prefix}-*.npz")
    slots = [int(x) for x in a.slots.split(",")]
    cost = CostModel()
    for title, fn in (("Traces", lambda: traces_table(tr, a.prefix)), ("Locality", lambda: locality_table(tr)),
                      ("Per-layer skew", lambda: skew_table(tr)),
                      ("Workload overlap (top-S sets per layer, mean over 48 layers)",
                       lambda: overlap_table(tr, slots[:3])),
                      ("Hit-rate curves", lambda: curves(tr, slots, cost, a.quick))):
        print(f"\n#### {title}\n", flush=True)
        fn()


if __name__ == "__main__":
    main()
