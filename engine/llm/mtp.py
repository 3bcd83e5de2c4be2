"""MTP speculative decoding (greedy) over two contexts on one model loaded with load_mtp=True: the target and a
LLAMA_CONTEXT_TYPE_MTP draft context whose KV holds only the NextN block.

The draft at position p reads the pair (target hidden state h[p-1], token p). We keep h for every position the
target has decoded, so a new chat turn, a rollback or a cancel only truncates both KV caches and re-feeds the
draft from the kept states. Verification: the target decodes [x, d1..dN]; the longest prefix of drafts that equal
the target's own argmax is accepted, plus the target's next token, so the output is the target's greedy text.
The draft context reads the model's expert cache (the NextN block may hold slots) but never configures, frees or
counts it: the cache belongs to the model, stats to the target context.
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from ..api import Sampling
from ..errors import ClosedError, EngineError
from ..native import lib as native
from .model import DRAFT, Context, Model, default_threads, track


@dataclasses.dataclass
class MTPStats:
    steps: int = 0          # target verify steps
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0         # tokens emitted by steps
    t_feed: float = 0.0     # seconds feeding the target's accepted rows to the draft context
    t_draft: float = 0.0    # seconds in draft decodes
    t_verify: float = 0.0   # seconds in the target's verify decodes
    t_other: float = 0.0    # the rest of step() (argmax/softmax, rollbacks, Python)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


def _ext():
    import llama_cpp.llama_cpp_ext as ext

    return ext


MAX_DRAFT = 7   # a verify batch of up to 8 tokens (every batch size takes the expert cache: engine v2)


class MTP:
    def __init__(self, model: Model, target: Context, n_draft: int = 1, threads: int | None = None):
        if not model.mtp_loaded:
            raise EngineError("MTP needs the model loaded with its NextN block (load_mtp)")
        if not 1 <= n_draft <= MAX_DRAFT:
            raise EngineError(f"draft length must be 1..{MAX_DRAFT}")
        L = native.llama()
        self.L, self.model, self.target, self.n_draft = L, model, target, n_draft
        cp = L.llama_context_default_params()
        cp.n_ctx = target.n_ctx
        cp.n_batch = cp.n_ubatch = target.n_batch
        cp.n_threads = cp.n_threads_batch = threads or default_threads()
        cp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        cp.ctx_other = target.live()           # (a closed target or model: ClosedError, not a crash)
        cp.no_perf = True
        self.ptr = L.llama_init_from_model(model.live(), cp)
        if not self.ptr:
            raise EngineError(f"could not create the MTP draft context: {native.recent_log(3).strip()}")
        ext = _ext()
        ext.llama_set_embeddings_nextn(target.ptr, True, False)   # one h row per target batch token
        ext.llama_set_embeddings_nextn(self.ptr, True, True)      # draft: h rows for output rows
        self.n_embd = model.n_embd
        self.h = np.zeros((target.n_ctx + 1, self.n_embd), np.float32)   # h[p]: target hidden state at position p
        self.fed = 0                                                      # draft KV holds positions < fed
        self.n_batch = target.n_batch
        self._batch = L.llama_batch_init(self.n_batch, self.n_embd, 1)
        self._tok = (L.llama_token * self.n_batch)()
        self._batch.token = ctypes.cast(self._tok, ctypes.POINTER(L.llama_token))
        self.stats = MTPStats()
        self.rules = Sampling()      # the reply's repeat penalty, top-k, min-p (temperature and top-p come with each
                                     # step): set by sample(..., mtp=) at each engine reply's first token
        target.on_chunk = self._after_target_chunk
        track(self, DRAFT)

    def live(self) -> Any:
        """The draft context's handle. After close() — its own, its target's or its model's (those close it first:
        it reads the target's state and the model's weights) — ClosedError instead of a crash."""
        if not self.ptr:
            raise ClosedError("the model is closed" if not self.model.ptr else
                              "the MTP draft's target context is closed" if not self.target.ptr else
                              "the MTP draft context is closed")
        return self.ptr

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self.target.on_chunk = None
            self._batch.token = ctypes.POINTER(self.L.llama_token)()   # ours: llama_batch_free must not free it
            self.L.llama_batch_free(self._batch)
            self.L.llama_free(self.ptr)
            self.ptr = None

    # -- keeping the draft in step with the target -------------------------------------------------------------

    def _after_target_chunk(self, pos0: int, n: int) -> None:
        """Called by Context.decode after each target chunk: keep its h rows."""
        p = _ext().llama_get_embeddings_nextn(self.target.ptr)
        self.h[pos0:pos0 + n] = np.ctypeslib.as_array(p, shape=(n, self.n_embd))

    def truncate(self, pos: int) -> None:
        """Forget draft positions >= pos (drafts just made, a rollback, a cancel or a new turn)."""
        if not self.L.llama_memory_seq_rm(self.L.llama_get_memory(self.live()), 0, pos, -1):
            raise EngineError("the MTP draft context could not roll back its KV cache")
        self.fed = min(self.fed, pos)

    def feed(self, tokens: Sequence[int], upto: int) -> None:
        """Feed draft rows for positions fed..upto-1 (token p with h[p-1]); tokens[p] is the token at p."""
        L, b, ptr = self.L, self._batch, self.live()
        while self.fed < upto:
            n = min(self.n_batch, upto - self.fed)
            b.n_tokens = n
            for i in range(n):
                p = self.fed + i
                self._tok[i] = tokens[p]
                b.pos[i] = p
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = 0
            emb = np.zeros((n, self.n_embd), np.float32)
            lo = self.fed
            if lo == 0:
                emb[1:] = self.h[0:n - 1]
            else:
                emb[:] = self.h[lo - 1:lo - 1 + n]
            ctypes.memmove(b.embd, emb.ctypes.data, emb.nbytes)
            rc = L.llama_decode(ptr, b)
            if rc != 0:
                raise EngineError(f"MTP draft decode failed ({rc})")
            self.fed += n

    def _draft_one(self, token: int, pos: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decode one draft row; returns (the draft's logits, its hidden state for the next draft row)."""
        L, b, ptr = self.L, self._batch, self.live()
        b.n_tokens = 1
        self._tok[0] = token
        b.pos[0] = pos
        b.n_seq_id[0] = 1
        b.seq_id[0][0] = 0
        b.logits[0] = 1
        ctypes.memmove(b.embd, np.ascontiguousarray(h, np.float32).ctypes.data, self.n_embd * 4)
        rc = L.llama_decode(ptr, b)
        if rc != 0:
            raise EngineError(f"MTP draft decode failed ({rc})")
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ptr, -1), shape=(self.model.n_vocab,))
        h_next = np.ctypeslib.as_array(_ext().llama_get_embeddings_nextn_ith(ptr, 0), shape=(self.n_embd,))
        return logits.copy(), h_next.copy()

    # -- one speculative step ------------------------------------------------------------------------------------

    def step(self, history: list[int], x: int, temperature: float = 0.0,
             rng: np.random.Generator | None = None, top_p: float = 1.0) -> list[int]:
        """history: tokens at positions 0..n-1 (all decoded by the target); x: the target's token at n.
        Drafts, verifies, rolls back, and returns the emitted tokens [x, accepted drafts..., next]; history is
        extended with all but the last (the last is the next step's x).

        temperature 0: greedy (a draft is accepted when it equals the target's argmax). temperature > 0:
        speculative sampling — draft d ~ q is accepted with probability min(1, p(d)/q(d)), a rejection samples from
        max(0, p - q) renormalised, and after all drafts the next token is sampled from p — so every emitted token
        is distributed exactly as sampling the target alone. top_p < 1 cuts p and q to their nuclei first (the
        same rule holds for any p and q). self.rules' penalty, top-k and min-p reshape every row's logits first,
        each row's recent tokens being history, x and the drafts before it (sample()'s rules, row by row)."""
        self.live()                 # (before the assert below: a closed target's n_past is stale)
        ctx = self.target
        n = ctx.n_past
        assert n == len(history), (n, len(history))
        sample = temperature > 0
        if sample and rng is None:
            rng = np.random.default_rng()
        rules = dataclasses.replace(self.rules, temperature=temperature, top_p=top_p)
        tail = history[-rules.repeat_last_n:] + [x] if rules.reshapes else []   # what the penalty looks back at
        t0 = time.perf_counter()
        self.feed(history, n)                                  # draft KV covers 0..n-1
        t1 = time.perf_counter()
        drafts: list[int] = []
        qs: list[np.ndarray] = []
        h = self.h[n - 1] if n > 0 else np.zeros(self.n_embd, np.float32)
        tok, pos = x, n
        budget = min(self.n_draft, ctx.n_ctx - n - 2)
        for _ in range(max(0, budget)):
            logits, h = self._draft_one(tok, pos, h)
            if sample:
                assert rng is not None
                q = probs(logits, rules, tail + drafts)
                d = int(rng.choice(q.size, p=q))
                qs.append(q)
            else:
                d = int(np.argmax(penalised(logits, rules, tail + drafts)))
            drafts.append(d)
            tok, pos = d, pos + 1
        self.truncate(n)                                       # draft rows are re-fed from the target's states
        t2 = time.perf_counter()
        ctx.decode([x] + drafts, all_logits=True)
        t3 = time.perf_counter()
        a = 0
        if sample:
            assert rng is not None
            nxt = -1
            while a < len(drafts):
                p = probs(ctx.logits(a), rules, tail + drafts[:a])
                d = drafts[a]
                if rng.random() < min(1.0, p[d] / max(qs[a][d], 1e-30)):
                    a += 1
                    continue
                r = np.maximum(p - qs[a], 0.0)
                nxt = int(rng.choice(r.size, p=r / r.sum())) if r.sum() > 0 else int(rng.choice(p.size, p=p))
                break
            if nxt < 0:
                nxt = int(rng.choice(ctx.model.n_vocab, p=probs(ctx.logits(a), rules, tail + drafts[:a])))
        else:                                                  # the argmax of each row's penalised logits
            ys = [int(np.argmax(penalised(ctx.logits(i), rules, tail + drafts[:i]))) if rules.reshapes
                  else ctx.argmax(i) for i in range(len(drafts) + 1)]
            while a < len(drafts) and drafts[a] == ys[a]:
                a += 1
            nxt = ys[a]
        ctx.truncate(n + 1 + a)                                # drop the rejected drafts
        out = [x] + drafts[:a] + [nxt]
        history.extend(out[:-1])
        self.stats.steps += 1
        self.stats.drafted += len(drafts)
        self.stats.accepted += a
        self.stats.tokens += len(out) - 1
        t4 = time.perf_counter()
        self.stats.t_feed += t1 - t0
        self.stats.t_draft += t2 - t1
        self.stats.t_verify += t3 - t2
        self.stats.t_other += t4 - t3
        return out


def attach(model: Model, ctx: Context, n_draft: int, threads: int | None, notices: list[str]) -> "MTP | None":
    """The draft context of `ctx` when the model's NextN block was loaded; else None, said in `notices`."""
    f = model.facts
    if f.n_nextn and not f.nextn_tensors:
        notices.append(f"{f.name} declares a NextN (MTP) block but the file carries none of its tensors: decoding "
                       "without MTP")
    elif not model.mtp_loaded:
        notices.append(f"{f.name} has no NextN (MTP) block: decoding without MTP")
    elif model.recurrent and ctx.rollback < n_draft:
        notices.append(f"{f.name}: this llama.cpp keeps no recurrent rollback room for {f.arch} (rejected drafts "
                       "could not be undone): decoding without MTP")
    else:
        return MTP(model, ctx, n_draft=n_draft, threads=threads)
    return None


def softmax(logits: np.ndarray, temperature: float, top_p: float = 1.0) -> np.ndarray:
    """softmax(logits / temperature), cut to its nucleus when top_p < 1: the most likely tokens whose probability
    reaches top_p keep theirs (renormalised), the others get 0."""
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    e = np.exp(z)
    p = e / e.sum()
    return p if top_p >= 1 else nucleus(p, top_p)


NUCLEUS_FIRST = 1024      # candidates sorted first (a partition, O(vocab)); all of them only when these fall short


def nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """p cut to the smallest set of most likely tokens (ties: lower id first) whose probability reaches top_p."""
    n = min(NUCLEUS_FIRST, p.size)
    cand = np.argpartition(-p, n - 1)[:n] if n < p.size else np.arange(p.size)
    if p[cand].sum() < top_p:                    # a flat distribution: the nucleus is wider than the candidates
        cand = np.arange(p.size)
    order = cand[np.lexsort((cand, -p[cand]))]
    keep = order[:int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1]
    out = np.zeros_like(p)
    out[keep] = p[keep]
    return out / out.sum()


def penalised(logits: np.ndarray, s: Sampling, recent: Sequence[int] = ()) -> np.ndarray:
    """logits under s's repeat penalty (llama.cpp's rule): each distinct token among the last s.repeat_last_n of
    `recent` has a positive logit divided by the penalty, a negative one multiplied by it (both make it less
    likely). The same array, untouched, when the penalty is off (1) or nothing is recent."""
    if s.repeat_penalty == 1 or not len(recent):
        return logits
    ids = np.unique(np.asarray(recent[-s.repeat_last_n:], np.int64))
    ids = ids[(ids >= 0) & (ids < logits.size)]
    out = np.array(logits, copy=True)
    v = out[ids]
    out[ids] = np.where(v > 0, v / s.repeat_penalty, v * s.repeat_penalty)
    return out


def cut(logits: np.ndarray, s: Sampling) -> np.ndarray:
    """logits with what top-k and min-p leave out at -inf (never the most likely token). top_k: the k highest logits
    (ties at the k-th: lower ids first); min_p: the tokens whose probability (at temperature 1, after top-k) is at
    least min_p x the most likely one's, i.e. logit >= max + ln(min_p). The same array when both are off."""
    z = logits
    if 0 < s.top_k < z.size:
        kth = np.partition(z, z.size - s.top_k)[z.size - s.top_k]       # the k-th highest logit
        keep = z > kth
        keep[np.flatnonzero(z == kth)[:s.top_k - int(keep.sum())]] = True
        z = np.where(keep, z, -np.inf)
    if s.min_p > 0:
        zf = z.astype(np.float64)
        z = np.where(np.exp(zf - zf.max()) >= s.min_p, z, -np.inf)   # p_i / p_max = exp(z_i - z_max)
    return z


def probs(logits: np.ndarray, s: Sampling, recent: Sequence[int] = ()) -> np.ndarray:
    """The distribution a sampled token is drawn from: the penalty, top-k and min-p, then softmax at s.temperature
    cut to s.top_p. With the three off: softmax(logits, temperature, top_p) itself, bit for bit."""
    return softmax(cut(penalised(logits, s, recent), s), s.temperature, s.top_p)


def sample(logits: np.ndarray, how: float | Sampling, rng: np.random.Generator, top_p: float = 1.0,
           recent: Sequence[int] = (), mtp: "MTP | None" = None) -> int:
    """One token. how: the reply's Sampling (a bare temperature, with top_p: no penalty, top-k or min-p). Greedy
    (temperature 0) is the argmax of the penalised logits, exactly (top-k, min-p, top-p keep the most likely token);
    else a draw from probs(). recent: the tokens so far (prompt and reply), for the repeat penalty. mtp: the
    reply's draft context, told the rules so its verify steps (MTP.step) draw under them too."""
    s = how if isinstance(how, Sampling) else Sampling(how, top_p)
    if mtp is not None:
        mtp.rules = s
    z = penalised(logits, s, recent)
    if s.greedy:
        return int(np.argmax(z))
    p = softmax(cut(z, s), s.temperature, s.top_p)
    return int(rng.choice(p.size, p=p))


def greedy_tokens(mtp: MTP, prompt: Sequence[int], n_predict: int, is_eog: Callable[[int], bool],
                  on_prefilled: Callable[[], None] | None = None) -> list[int]:
    """Greedy generation with MTP drafts: the same tokens as plain greedy decoding of the target.
    on_prefilled: called once the prompt is in both KV caches (the target's and the draft's), before the first
    step, so a caller can time decoding alone."""
    ctx = mtp.target
    ctx.reset()
    mtp.truncate(0)
    mtp.rules = Sampling()                        # plain greedy: no rules a chat reply left behind
    ctx.decode(list(prompt), prompt=True)
    history = list(prompt)
    mtp.feed(history, ctx.n_past)                 # the prompt's draft rows: prompt work, not the first step's
    if on_prefilled is not None:
        on_prefilled()
    x = ctx.argmax()
    out: list[int] = []
    while len(out) < n_predict and not is_eog(x) and ctx.n_past + mtp.n_draft + 2 < ctx.n_ctx:
        emitted = mtp.step(history, x)
        for t in emitted[:-1]:
            if is_eog(t) or len(out) >= n_predict:
                return out
            out.append(t)
        x = emitted[-1]
    return out
