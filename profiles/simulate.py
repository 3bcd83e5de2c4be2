"""What-if simulator: replay a trace's decode rows through residency policies at S slots per layer.

Policies: static-profile (plan from a training trace), static-oracle (plan from the replayed trace itself: the best
any static set can do), lru, lfu-decay (frequency with exponential decay, admission when the newcomer outscores the
weakest resident), reelect-K (every K tokens re-pick the top S of a recent window). All layers advance together as
numpy arrays; only time is a Python loop.

Each result carries an estimated ms/token from the cost model of profiles/costs.py. Choosing a re-pick interval
from these simulations (`--repick auto`) is profiles/repick.py.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from .costs import CostModel
from .plan import plan_from_counts
from .profile import from_trace
from .trace import Trace, TraceError

POLICIES = ("static-profile", "static-oracle", "lru", "lfu-decay", "reelect")


@dataclasses.dataclass(frozen=True)
class SimResult:
    policy: str
    slots: int
    hit_rate: float                 # picks served from VRAM (for dynamic policies: found resident when picked)
    uploads_per_token: float        # slabs copied host -> GPU per decode token
    cpu_picks_per_token: float
    ms_per_token: float

    def mb_per_token(self, cost: CostModel) -> float:
        return self.uploads_per_token * cost.slab_mb


def token_matrix(t: Trace, max_step: int = 16) -> tuple[list[int], np.ndarray]:
    """Decode rows as [n_tokens, n_layers, k], tokens in order. Rows of one batch come layer by layer (a verify
    batch writes pos n, n+1, n, n+1, ...), so rows are grouped by position, not by adjacency; a position that
    drops by more than `max_step`, or one after prompt rows, starts a new recording (merged traces restart at 0;
    the recorder writes each turn's prompt rows before its reply's). A repeated (pos, layer)
    keeps its last row (a re-decoded position after an MTP rollback); tokens missing a layer are dropped."""
    d = t.decode
    pos, layer, ids = t.pos[d], t.layer[d], t.ids[d]
    if pos.size == 0:
        raise TraceError("the trace has no decode rows to simulate")
    # prompt rows after decode rows start a new turn (a recorder's next prompt): its tokens never merge with the
    # last turn's, even where a short reply leaves the positions within max_step of each other
    turn = np.concatenate([[0], np.cumsum(~d[1:] & d[:-1])])[d]
    seg = np.zeros(pos.size, np.int64)
    run_max = pos[0]
    s = 0
    for i in range(1, pos.size):                 # cheap: one pass of Python ints over rows
        if turn[i] != turn[i - 1] or pos[i] < run_max - max_step:
            s += 1
            run_max = pos[i]
        else:
            run_max = max(run_max, pos[i])
        seg[i] = s
    layers = sorted(int(x) for x in np.unique(layer))
    lidx = np.searchsorted(np.array(layers), layer)
    tok_key = seg * (1 << 40) + pos
    uniq, tok = np.unique(tok_key, return_inverse=True)
    out = np.full((uniq.size, len(layers), t.k), -1, np.int32)
    out[tok, lidx] = ids                         # later rows overwrite earlier ones: the last row wins
    keep = (out >= 0).all(axis=(1, 2))
    if not keep.any():
        raise TraceError("no decode token has rows for every layer")
    return layers, out[keep]


def layer_counts(P: np.ndarray, layers: Sequence[int], n_expert: int) -> np.ndarray:
    """Picks per (model layer, expert) of a token matrix [T, len(layers), k] whose column j is model layer
    layers[j]; rows of other layers stay 0 (plan_from_counts' input)."""
    counts = np.zeros((max(layers) + 1, n_expert), np.int64)
    for j, il in enumerate(layers):
        counts[il] = np.bincount(P[:, j].ravel(), minlength=n_expert)
    return counts


def static_hits(P: np.ndarray, resident: np.ndarray) -> tuple[float, float]:
    """A fixed resident set [L, n_expert]: (hit rate, CPU picks per token)."""
    L = P.shape[1]
    hit = resident[np.arange(L)[None, :, None], P]
    return float(hit.mean()), float((~hit).sum() / P.shape[0])


def resident_from_plan(plan: dict[int, tuple[int, ...]], layers: list[int], n_expert: int) -> np.ndarray:
    """A slot plan as a resident mask [len(layers), n_expert], row i = model layer layers[i]."""
    r = np.zeros((len(layers), n_expert), bool)
    for i, il in enumerate(layers):
        r[i, list(plan.get(il, ()))] = True
    return r


def _lru(P: np.ndarray, S: int, n_expert: int) -> tuple[float, float]:
    T, L, k = P.shape
    if S <= 0:
        return 0.0, 0.0
    last = np.full((L, n_expert), -np.inf)
    resident = np.zeros((L, n_expert), bool)
    n_res = np.zeros(L, np.int64)
    hits = uploads = 0
    rows = np.arange(L)
    for t in range(T):
        for j in range(k):
            e = P[t, :, j]
            h = resident[rows, e]
            hits += int(h.sum())
            miss = ~h
            if miss.any():
                full = miss & (n_res >= S)
                if full.any():
                    score = np.where(resident, last, np.inf)
                    victim = np.argmin(score, axis=1)
                    fr = rows[full]
                    resident[fr, victim[full]] = False
                    n_res[fr] -= 1
                mr = rows[miss]
                resident[mr, e[miss]] = True
                n_res[mr] += 1
                uploads += int(miss.sum())
            last[rows, e] = t + j / (k + 1)
    return hits / (T * L * k), uploads / T


def _lfu_decay(P: np.ndarray, S: int, n_expert: int, decay: float = 0.98) -> tuple[float, float, float]:
    T, L, k = P.shape
    if S <= 0:
        return 0.0, 0.0, float(L * k)
    score = np.zeros((L, n_expert))
    resident = np.zeros((L, n_expert), bool)
    n_res = np.zeros(L, np.int64)
    hits = uploads = cpu = 0
    rows = np.arange(L)
    for t in range(T):
        score *= decay
        for j in range(k):
            e = P[t, :, j]
            score[rows, e] += 1.0
            h = resident[rows, e]
            hits += int(h.sum())
            miss = ~h
            if not miss.any():
                continue
            space = miss & (n_res < S)
            if space.any():
                sr = rows[space]
                resident[sr, e[space]] = True
                n_res[sr] += 1
                uploads += int(space.sum())
            full = miss & ~space
            if full.any():
                masked = np.where(resident, score, np.inf)
                victim = np.argmin(masked, axis=1)
                vscore = masked[rows, victim]
                admit = full & (score[rows, e] > vscore)
                ar = rows[admit]
                resident[ar, victim[admit]] = False
                resident[ar, e[admit]] = True
                uploads += int(admit.sum())
                cpu += int((full & ~admit).sum())
    return hits / (T * L * k), uploads / T, cpu / T


class Residency:
    """The engine's re-pick rule (plan.elect on the last `window` tokens' counts, at most `max_swaps` per layer,
    `margin`) as a simulation whose residents carry over from one `run` to the next: a session in which the
    interval changes (live `--repick auto`) is simulated piece by piece. `decay` < 1 weighs a pick `decay**age`
    tokens old (a what-if: the engine counts the window's picks alike, decay 1). `since` counts the tokens since
    the last re-pick, as the engine does; set it to 0 where the interval changes (the engine's set_repick)."""

    def __init__(self, initial: np.ndarray, S: int, window: int = 64, max_swaps: int | None = None,
                 margin: float = 0.0, decay: float = 1.0) -> None:
        self.resident = initial.copy()
        self.slots: list[list[int]] = [np.flatnonzero(initial[layer])[:S].tolist()   # fill to S
                                       for layer in range(initial.shape[0])]
        self.S, self.window, self.max_swaps, self.margin, self.decay = S, window, max_swaps, margin, decay
        self.since = 0

    def advance(self, P: np.ndarray, a: int, b: int, K: int) -> tuple[int, int]:
        """Tokens a..b-1 of P as the engine steps them: after each K-th token since the last re-pick (K = 0:
        never), a re-pick from the `window` tokens before the next one — also after token b-1, unless it is P's
        last. Tokens before a are the first window's history (the engine's ring). Returns (picks served, slabs
        uploaded)."""
        rows = np.arange(P.shape[1])
        hits = uploads = 0
        t = a
        while t < b:
            stop = min(b, t + K - self.since) if K else b
            hits += int(self.resident[rows[None, :, None], P[t:stop]].sum())
            self.since += stop - t
            t = stop
            if K and self.since >= K:
                self.since = 0
                if t < len(P):
                    uploads += self.repick(P, t)
        return hits, uploads

    def repick(self, P: np.ndarray, t0: int) -> int:
        """One re-pick before token t0, from the `window` tokens before it. Returns the slabs uploaded."""
        from .plan import elect

        if self.S <= 0:
            return 0
        L, n_expert = P.shape[1], self.resident.shape[1]
        rows = np.arange(L)
        w = P[max(0, t0 - self.window):t0]
        weight = 1.0 if self.decay == 1.0 else np.broadcast_to(
            (self.decay ** np.arange(len(w) - 1, -1, -1))[:, None, None], w.shape).ravel()
        counts = np.zeros((L, n_expert), np.float64)
        np.add.at(counts, (np.broadcast_to(rows[None, :, None], w.shape).ravel(), w.ravel()), weight)
        uploads = 0
        for layer in range(L):
            for slot, e in elect(counts[layer], self.slots[layer], self.max_swaps or self.S, self.margin):
                self.resident[layer, self.slots[layer][slot]] = False
                self.resident[layer, e] = True
                self.slots[layer][slot] = e
                uploads += 1
        return uploads


def run_schedule(P: np.ndarray, start: int, initial: np.ndarray, S: int, schedule: Sequence[tuple[int, int]],
                 window: int = 64, max_swaps: int | None = None, margin: float = 0.0) -> tuple[float, float]:
    """Tokens start.. of P under a schedule of (from token, interval) pairs, the first at `start` (live `--repick
    auto` changes the interval as it goes); residents carry over. As in the engine, a re-pick that falls due on
    the token where the interval changes is done before the change. Returns (hit rate, uploads per token)."""
    T, L, k = P.shape
    r = Residency(initial, S, window, max_swaps, margin)
    hits = uploads = 0
    ends = [t for t, _ in schedule[1:]] + [T]
    for (t, n), end in zip(schedule, ends, strict=True):
        r.since = 0                                   # a new interval counts from here (the engine's set_repick)
        h, u = r.advance(P, t, end, n)
        hits, uploads = hits + h, uploads + u
    return hits / ((T - start) * L * k), uploads / (T - start)


def reelect(P: np.ndarray, S: int, n_expert: int, K: int, window: int, initial: np.ndarray,
             max_swaps: int | None = None, margin: float = 0.0, start: int = 0) -> tuple[float, float]:
    """Every K tokens, plan.elect on the last `window` tokens' counts (the engine's repick rule), over tokens
    start.. of P (the earlier ones are the first window's history). Returns (hit rate, uploads per token)."""
    T, L, k = P.shape
    hits, uploads = Residency(initial, S, window, max_swaps, margin).advance(P, start, T, K)
    return hits / ((T - start) * L * k), uploads / (T - start)


def _extent(t: Trace, layers: Sequence[int]) -> int:
    """Rows of a counts array for `t`: the simulated (decode) layers, and any layer its other rows name (a prompt
    row may route a layer no decode row does)."""
    return max(max(layers) + 1, int(t.layer.max()) + 1 if t.n_rows else 0)


def simulate(test: Trace, slots: int, policies: Sequence[str] = POLICIES, *, train: Trace | None = None,
             reelect_k: int = 16, reelect_window: int = 64, cost: CostModel | None = None) -> list[SimResult]:
    cost = cost or CostModel()
    layers, P = token_matrix(test)
    n_expert = max(test.n_expert, int(P.max()) + 1)
    T, L, k = P.shape
    src = train if train is not None else test
    train_counts = from_trace(src, _extent(src, layers), n_expert).counts
    oracle_counts = from_trace(test, _extent(test, layers), n_expert).counts
    profile_res = resident_from_plan(plan_from_counts(train_counts, slots, layers), layers, n_expert)
    out = []
    for pol in policies:
        if pol in ("static-profile", "static-oracle"):
            res = profile_res if pol == "static-profile" else resident_from_plan(
                plan_from_counts(oracle_counts, slots, layers), layers, n_expert)
            hr, cpu = static_hits(P, res)
            up = 0.0
        elif pol == "lru":
            hr, up = _lru(P, slots, n_expert)
            cpu = 0.0 if slots > 0 else float(L * k)
        elif pol == "lfu-decay":
            hr, up, cpu = _lfu_decay(P, slots, n_expert)
        elif pol.startswith("reelect"):
            kk = int(pol.split("-", 1)[1]) if "-" in pol else reelect_k
            hr, up = reelect(P, slots, n_expert, kk, max(reelect_window, kk), profile_res)
            cpu = (1 - hr) * L * k
            pol = f"reelect-{kk}"
        else:
            raise ValueError(f"unknown policy {pol!r} (choose from {', '.join(POLICIES)})")
        gpu = L * k - cpu
        out.append(SimResult(pol, slots, hr, up, cpu, cost.ms_per_token(gpu, cpu, up)))
    return out


def distinct_per_batch(test: Trace, slots: int, *, train: Trace | None = None,
                       max_batch: int = 4) -> dict[int, float]:
    """Union of experts: for batches of w = 1..max_batch consecutive decode tokens (MTP verify batches), the mean
    number of distinct experts per layer the batch computes on the CPU (picked and not resident under the static
    plan of `slots` from `train`). A bandwidth-bound CPU side costs in proportion to it."""
    layers, P = token_matrix(test)
    n_expert = max(test.n_expert, int(P.max()) + 1)
    T, L, k = P.shape
    src = train if train is not None else test
    counts = from_trace(src, _extent(src, layers), n_expert).counts
    res = resident_from_plan(plan_from_counts(counts, slots, layers), layers, n_expert) if slots else \
        np.zeros((L, n_expert), bool)
    out = {}
    for w in range(1, max_batch + 1):
        n = T // w
        if n == 0:
            break
        B = P[:n * w].reshape(n, w, L, k).transpose(0, 2, 1, 3).reshape(n, L, w * k)   # [batch, layer, picks]
        hit = np.zeros((n, L, n_expert), bool)
        np.put_along_axis(hit, B, True, axis=2)
        out[w] = float((hit & ~res[None]).sum(axis=2).mean())
    return out
