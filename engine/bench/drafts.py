"""`moeslots bench mtp`: greedy decode tok/s with and without MTP drafts at each slot count and draft length, the
acceptance, tokens per step, the time of each phase of a step, and whether the text is plain greedy's."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ...profiles.plan import plan_from_counts
from ...profiles.simulate import layer_counts
from ..api import Message
from ..llm.model import Context, LoadOptions, Model
from ..llm.mtp import MTP, greedy_tokens
from ..llm.template import render_chat
from ..native import replay
from ..native.expert_cache import SlotPlan


@dataclasses.dataclass
class MTPRow:
    slots: int
    draft: int
    plain_tok_s: float
    mtp_tok_s: float
    acceptance: float
    tokens_per_step: float
    same_text: bool
    same_prefix: int               # tokens equal to plain greedy before the first difference
    ms_step: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)   # per step: feed, drafts, verify, rest


def run_mtp(model_path: Path, slot_counts: Sequence[int], drafts: Sequence[int], *, n_tokens: int = 128,
            threads: int | None = None, pack_host: bool = False, seed: int = 0, prompt_text: str | None = None,
            mtp_head: str = "gpu", replay_from: str | None = None, mmap: bool = True,
            log: Callable[[str], None] = print) -> list[MTPRow]:
    """Greedy decode tok/s with and without MTP drafts at each slot count and draft length (plan: top-S of a
    0-slot profiling pass). mtp_head: where the NextN block's experts live: "slots" (host memory, in the plan
    like a trunk layer), "host" (host memory, no slots) or "gpu" (on the GPU with the rest of its layer).
    prompt_text: a user turn rendered with the model's chat template (trained models: real acceptance); default
    random tokens. replay_from ("uniform" or a
    trace CSV): the trunk routes through those ids (a random model's greedy text repeats itself, and so would its
    routing); the plan is then the top-S of the 1,024 rows before the replayed ones (out of sample)."""
    if mtp_head not in ("slots", "host", "gpu"):
        raise ValueError(f"--mtp-head is slots, host or gpu, not {mtp_head!r}")
    m = Model(model_path, LoadOptions(experts_on_host=True, load_mtp=True, mtp_head_on_gpu=mtp_head == "gpu",
                                      extra_bufts=not pack_host, use_mmap=mmap))
    if not m.mtp_loaded:
        m.close()
        raise ValueError(f"{model_path} has no NextN (MTP) block")
    f = m.facts
    ctx = Context(m, n_ctx=n_tokens + 256, n_batch=512, threads=threads, rollback=max(drafts))
    plan_counts = None
    if replay_from:
        if mtp_head == "slots":
            raise ValueError("--replay replays the trunk's routing: use --mtp-head gpu or host with it")
        trunk = [il for il in f.moe_layers if il < f.n_layer]
        need = 1024 + ctx.n_ctx
        full = (replay.uniform(need, len(trunk), f.n_expert, f.n_expert_used, seed=7) if replay_from == "uniform"
                else replay.from_trace(Path(replay_from), f.n_expert, f.n_expert_used))
        if full.n_rows < need:
            raise ValueError(f"{replay_from}: {full.n_rows} decode rows, the benchmark needs {need}")
        plan_counts = layer_counts(full.per_layer(trunk)[:1024], trunk, f.n_expert)
        replay.set_replay(ctx.ptr, replay.ReplayTable(full.ids[1024:need], full.source))
        log(f"routing replayed: {full.source}; plan from the 1,024 rows before the replayed ones")
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(0, m.n_vocab - 16, 64)]
    if prompt_text is not None:
        prompt = m.tokenize(render_chat(m, [Message("user", prompt_text)]), add_special=False, parse_special=True)
    ctx.enable_stats(ring_rows=0)
    ctx.decode(prompt, prompt=True)
    for t in rng.integers(0, m.n_vocab - 16, 128):
        ctx.decode([int(t)])
    prof = ctx.read_stats()
    ctx.disable_stats()
    counts = prof.picks_decode + prof.picks_prompt if plan_counts is None else plan_counts
    rows: list[MTPRow] = []

    def plain() -> tuple[list[int], float]:
        ctx.reset()
        ctx.decode(prompt, prompt=True)
        out = []
        t0 = time.perf_counter()
        for _ in range(n_tokens):
            t = ctx.argmax()
            out.append(t)
            ctx.decode([t])
        return out, time.perf_counter() - t0

    for s in slot_counts:
        s = min(s, f.n_expert)
        layers = f.moe_layers if mtp_head == "slots" else [il for il in f.moe_layers if il < f.n_layer]
        m.set_slots(SlotPlan(plan_from_counts(counts, s, layers)), pack_host=pack_host)
        plain()                                                  # warm-up (graphs)
        ref, dt_plain = plain()
        for d in drafts:
            mtp = MTP(m, ctx, n_draft=d, threads=threads)
            try:
                greedy_tokens(mtp, prompt, 16, lambda t: False)    # warm-up
                mtp.stats = type(mtp.stats)()
                ctx.reset()
                t0s: list[float] = []                              # decode time only, as plain(): the
                got = greedy_tokens(mtp, prompt, n_tokens, lambda t: False,   # prompt (both contexts) is not
                                    on_prefilled=lambda: t0s.append(time.perf_counter()))           # timed
                dt = time.perf_counter() - t0s[0]
            finally:
                mtp.close()
            prefix = next((i for i, (x, y) in enumerate(zip(got, ref)) if x != y), min(len(got), len(ref)))
            st = mtp.stats
            per = tuple(1000 * v / max(1, st.steps) for v in (st.t_feed, st.t_draft, st.t_verify, st.t_other))
            row = MTPRow(s, d, n_tokens / dt_plain, len(got) / dt, st.acceptance, st.tokens_per_step,
                         got == ref[:len(got)], prefix, per)  # type: ignore[arg-type]
            rows.append(row)
            log(f"| {s} | {d} | {row.plain_tok_s:.1f} | {row.mtp_tok_s:.1f} | {100 * row.acceptance:.0f} % | "
                f"{row.tokens_per_step:.2f} | {'yes' if row.same_text else f'first {row.same_prefix} of {len(got)}'} | "
                + " / ".join(f"{v:.1f}" for v in row.ms_step) + " |")
    ctx.close()
    m.close()
    return rows
