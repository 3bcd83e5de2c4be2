"""How well the next layer's misses can be guessed from this layer's picks, on recorded routing: what a lookahead that
copies the next layer's likely misses early (engine v3, prefetch only: the router still decides) could get. For each
trace, a static plan of S slots from its first 1024 tokens; from the same tokens a table of how often expert e at
layer l came with expert f at layer l + 1. Then for held-out tokens (1040 on, up to 2000 of them) and every layer:
score the next layer's experts by the table's rows of this layer's picks, take the best m that are not resident,
and count how many of the next layer's misses they catch (recall) and how many of them were misses (precision).
Beside it the same guess without this layer's picks: the next layer's most picked experts that are not resident
(what the picks add over a fixed guess).
Usage: python3 -P scripts/lookahead.py [TRACE.npz ...] (default: the donor traces in profiles/data)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from moeslots.engine.native import replay
from moeslots.profiles.plan import plan_from_counts
from moeslots.profiles.simulate import layer_counts

DATA = Path(__file__).resolve().parents[1] / "profiles" / "data"
E, K = 128, 8
PROFILE, START, TOKENS = 1024, 1040, 2000


def cooccurrence(P: np.ndarray) -> np.ndarray:
    """(L - 1, E, E): how often expert e at layer l came with expert f at layer l + 1, over the rows of P (T, L, K)."""
    T, L, _ = P.shape
    C = np.zeros((L - 1, E, E))
    a = np.repeat(P[:, :-1, :, None], K, axis=3)        # (T, L-1, K, K): this layer's pick
    b = np.repeat(P[:, 1:, None, :], K, axis=2)         # ...the next layer's pick
    layer = np.broadcast_to(np.arange(L - 1)[None, :, None, None], a.shape)
    np.add.at(C, (layer.ravel(), a.ravel(), b.ravel()), 1)
    return C


def guess(P: np.ndarray, C: np.ndarray, resident: np.ndarray, m: int,
          fixed: bool = False) -> tuple[float, float, float]:
    """(misses a layer, recall, precision) of the best m non-resident guesses for the next layer, over P's rows
    (fixed: by the next layer's pick counts alone, the same guess every token)."""
    T, L, _ = P.shape
    caught = misses = guessed = 0
    for il in range(L - 1):
        if fixed:                                        # the next layer's counts: the table's column sums
            score = np.broadcast_to(C[il].sum(axis=0), (T, E)).copy()
        else:
            score = C[il][P[:, il]].sum(axis=1)            # (T, E): the table's rows of this layer's picks
        score[:, resident[il + 1]] = -1
        top = np.argsort(-score, axis=1, kind="stable")[:, :m]
        ok = np.take_along_axis(score, top, axis=1) > 0
        miss = ~resident[il + 1][P[:, il + 1]]             # (T, K)
        hit = (P[:, il + 1][:, :, None] == top[:, None, :]) & ok[:, None, :]
        caught += int((hit.any(axis=2) & miss).sum())
        misses += int(miss.sum())
        guessed += int(ok.sum())
    return misses / T / (L - 1), caught / max(misses, 1), caught / max(guessed, 1)


def main() -> None:
    traces = [Path(a) for a in sys.argv[1:]] or sorted(DATA.glob("moeslots-donor-*.npz"))
    print("| trace | slots | guesses a layer | misses a layer | recall, precision: by this layer's picks | "
          "by counts alone |\n" + "|---" * 6 + "|")
    for path in traces:
        full = replay.from_trace(path, E, K)
        P = np.asarray(full.per_layer(list(range(48))))
        prof, test = P[:PROFILE], P[START:START + TOKENS]
        C = cooccurrence(prof)
        layers = list(range(P.shape[1]))
        for S in (32, 64):
            resident = np.zeros((P.shape[1], E), bool)
            for il, ex in plan_from_counts(layer_counts(prof, layers, E), S, layers).items():
                resident[il, list(ex)] = True
            for m in (2, 4, 8):
                per, recall, precision = guess(test, C, resident, m)
                _, r0, p0 = guess(test, C, resident, m, fixed=True)
                print(f"| {path.stem.removeprefix('moeslots-donor-qwen3-30b-a3b-')} | {S} | {m} | {per:.2f} | "
                      f"{recall:.2f}, {precision:.2f} | {r0:.2f}, {p0:.2f} |", flush=True)


if __name__ == "__main__":
    main()
