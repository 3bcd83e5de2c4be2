"""`moeslots bench decode`: decode and prompt speed of the static expert cache at several slot counts, with the
routing regime, hit rate and weight bytes crossing to the GPU per decode token; `moeslots bench compare`: greedy text
at each slot count against 0 slots (the cache must not change it).

Timed decode feeds random tokens one per step (teacher forcing): the same compute as greedy decoding, but routing
that does not collapse into the short cycles greedy text from random weights falls into. Both plan the slots from
the same 0-slot pass over the same random input (in-sample: per layer the top-S experts it picked).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ...profiles.plan import plan_from_counts
from ..llm.model import Context, LoadOptions, Model
from ..native import expert_cache as cache
from ..native import replay, routing_stats
from ..native.expert_cache import SlotPlan


@dataclasses.dataclass
class BenchRow:
    slots: int
    pack_mib: float
    prompt_tok_s: float
    decode_tok_s: float
    ms_per_token_median: float
    ms_per_token_p90: float
    hit_rate: float
    upload_mb_per_token: float
    distinct_per_layer: float
    top10_share: float
    load_line: str
    splits: int = -1                 # backend runs of a 1-token decode graph (-1: engine without the counter)
    timing: dict | None = None       # per decode token, ms: where the scheduler's time went (--timing; SchedTiming)


@dataclasses.dataclass
class CompareRow:
    slots: int
    agreement: float                 # greedy tokens equal to 0 slots' (1.0: the same text)
    same_texts: int                  # of the prompts, those whose whole greedy text equals 0 slots'
    prompts: int
    load_line: str


def _regime(picks: np.ndarray, moe_layers: Sequence[int]) -> tuple[float, float]:
    """Mean over the routed layers of (distinct experts, top-10 % share)."""
    per = [routing_stats.regime(picks[il]) for il in moe_layers if picks[il].sum() > 0]
    return (float(np.mean([d for d, _ in per])), float(np.mean([t for _, t in per]))) if per else (0.0, 0.0)


class _Bench:
    """The model loaded with experts in host memory, the random input, and the 0-slot routing that plans S slots."""

    def __init__(self, model_path: Path, *, n_decode: int, prompt_len: int, threads: int | None, mmap: bool,
                 pack_host: bool, seed: int, replay_from: str | None, n_greedy: int = 0, greedy_tokens: int = 0,
                 op_offload: bool = True, all_gpu: bool = False, timing: bool = False):
        self.m = m = Model(model_path, LoadOptions(experts_on_host=not all_gpu, use_mmap=mmap,
                                                   extra_bufts=not pack_host))
        f = m.facts
        self.moe = [il for il in f.moe_layers if il < f.n_layer]       # trunk layers (no MTP context here)
        self.pack_host, self.prompt_len, self.greedy_tokens = pack_host, prompt_len, greedy_tokens
        self.timing = timing
        self.last_timing: dict | None = None
        n_ctx = max(prompt_len + n_decode, 64 + greedy_tokens) + 16
        self.ctx = ctx = Context(m, n_ctx=n_ctx, n_batch=max(512, prompt_len), threads=threads, op_offload=op_offload)
        ctx.enable_stats(ring_rows=0)          # the warm-up profile needs them; turned off by the caller if asked
        self.routing = "the model's router"
        if replay_from:
            table = (replay.uniform(4096, len(self.moe), f.n_expert, f.n_expert_used, seed=seed)
                     if replay_from == "uniform" else replay.from_trace(Path(replay_from), f.n_expert, f.n_expert_used))
            replay.set_replay(ctx.ptr, table)
            self.routing = "replayed: " + table.source
        rng = np.random.default_rng(seed)
        n_normal = m.n_vocab - 16
        self.prompt = [int(t) for t in rng.integers(0, n_normal, prompt_len)]
        self.stream = [int(t) for t in rng.integers(0, n_normal, n_decode)]
        self.greedy_starts = [[int(t) for t in rng.integers(0, n_normal, 32)] for _ in range(n_greedy)]

    def profile(self, log: Callable[[str], None]) -> np.ndarray:
        log("warm-up + profile (0 slots)")
        self.timed()                                                  # warm-up: page in the weights
        _, _, prof, _ = self.timed()
        assert prof is not None
        return prof.picks_decode + prof.picks_prompt

    def set_slots(self, profile: np.ndarray, s: int) -> str:
        return self.m.set_slots(SlotPlan(plan_from_counts(profile, s, self.moe)), pack_host=self.pack_host)

    def timed(self) -> tuple[float, list[float], "routing_stats.RoutingStats | None", int]:
        ctx = self.ctx
        ctx.reset()
        routing_stats.reset(ctx.ptr)
        t0 = time.perf_counter()
        ctx.decode(self.prompt, prompt=True)
        pp = time.perf_counter() - t0
        b0 = routing_stats.weight_copy_bytes()
        if self.timing:
            routing_stats.sched_timing(True)
        per = []
        for t in self.stream:
            t1 = time.perf_counter()
            ctx.decode([t])
            per.append(time.perf_counter() - t1)
        if self.timing:
            self.last_timing = timing_per_token(routing_stats.sched_timing(False), per)
        moved = routing_stats.weight_copy_bytes() - b0
        st = ctx.read_stats() if ctx.stats_ring >= 0 else None
        return pp, per, st, moved

    def warm(self) -> None:
        """After a reconfigure: build the prompt-path and decode-path graphs once."""
        self.ctx.reset()
        self.ctx.decode(self.prompt[:64], prompt=True)
        for t in self.stream[:4]:
            self.ctx.decode([t])

    def greedy(self) -> list[list[int]]:
        ctx, outs = self.ctx, []
        for start in self.greedy_starts:
            ctx.reset()
            ctx.decode(start, prompt=True)
            toks = []
            for _ in range(self.greedy_tokens):
                t = ctx.argmax()
                toks.append(t)
                ctx.decode([t])
            outs.append(toks)
        return outs

    def close(self) -> None:
        self.ctx.close()
        self.m.close()


def run(model_path: Path, slot_counts: Sequence[int], *, n_decode: int = 128, prompt_len: int = 512,
        threads: int | None = None, mmap: bool = True, pack_host: bool = False, seed: int = 0,
        with_stats: bool = True, replay_from: str | None = None, op_offload: bool = True, all_gpu: bool = False,
        timing: bool = False, log: Callable[[str], None] = print) -> tuple[list[BenchRow], dict]:
    """`bench decode`: at each slot count, prompt and decode speed, hit rate, uploads, splits and routing regime.
    op_offload False: prompt batches compute the host chain on the CPU instead of streaming its experts to the GPU.
    all_gpu: stock llama.cpp with every expert on the GPU (no host experts, no cache; slot_counts ignored): the
    reference a fully resident cache is held to. timing: where each decode token's time went (the scheduler's clock,
    timing_per_token), in the row and the log."""
    b = _Bench(model_path, n_decode=n_decode, prompt_len=prompt_len, threads=threads, mmap=mmap,
               pack_host=pack_host, seed=seed, replay_from=replay_from, op_offload=op_offload, all_gpu=all_gpu,
               timing=timing)
    m, f = b.m, b.m.facts
    info = {"model": str(model_path), "arch": f.arch, "n_layer": f.n_layer, "n_expert": f.n_expert,
            "k": f.n_expert_used, "mmap": mmap, "threads": threads, "n_decode": n_decode, "prompt_len": prompt_len,
            "stats": with_stats, "routing": b.routing, "op_offload": op_offload, "all_gpu": all_gpu}
    rows: list[BenchRow] = []
    try:
        profile = b.profile(log)
        if not with_stats:
            b.ctx.disable_stats()
        for s in ([f.n_expert] if all_gpu else slot_counts):
            s = min(s, f.n_expert)
            line = "every expert on the GPU (stock, no cache)" if all_gpu else b.set_slots(profile, s)
            log(f"{s} slots: {line}")
            b.warm()
            pp, per, st, moved = b.timed()
            splits = b.ctx.graph_splits()                            # of the last graph: a 1-token decode
            distinct, top10 = _regime(st.picks_decode, b.moe) if st is not None else (float("nan"), float("nan"))
            rows.append(BenchRow(
                slots=s, pack_mib=cache.pack_bytes(m.ptr) / 2**20, prompt_tok_s=prompt_len / pp,
                decode_tok_s=len(per) / sum(per), ms_per_token_median=1000 * statistics.median(per),
                ms_per_token_p90=1000 * float(np.percentile(per, 90)), hit_rate=st.hit_rate if st else float("nan"),
                upload_mb_per_token=moved / len(per) / 1e6, distinct_per_layer=distinct, top10_share=top10,
                load_line=line, splits=splits, timing=b.last_timing))
            log(render_row(rows[-1]))
            if b.last_timing:
                log(render_timing(s, b.last_timing))
    finally:
        b.close()
    return rows, info


def compare(model_path: Path, slot_counts: Sequence[int], *, prompts: int = 4, tokens: int = 256,
            threads: int | None = None, mmap: bool = True, pack_host: bool = False, seed: int = 0,
            replay_from: str | None = None, log: Callable[[str], None] = print) -> list[CompareRow]:
    """`bench compare`: greedy text from `prompts` random 32-token starts, `tokens` each, at each slot count, against
    0 slots (run first as the reference). The plan is decode's (the same 0-slot pass over the same input)."""
    b = _Bench(model_path, n_decode=128, prompt_len=512, threads=threads, mmap=mmap, pack_host=pack_host, seed=seed,
               replay_from=replay_from, n_greedy=prompts, greedy_tokens=tokens)
    rows: list[CompareRow] = []
    try:
        profile = b.profile(log)
        b.set_slots(profile, 0)
        ref = b.greedy()
        for s in slot_counts:
            s = min(s, b.m.facts.n_expert)
            line = b.set_slots(profile, s)
            log(f"{s} slots: {line}")
            g = b.greedy()
            rows.append(CompareRow(s, float((np.array(g) == np.array(ref)).mean()) if prompts else 1.0,
                                   sum(x == y for x, y in zip(g, ref)), prompts, line))
            log(render_compare_row(rows[-1]))
    finally:
        b.close()
    return rows


def timing_per_token(t: "routing_stats.SchedTiming | None", per: Sequence[float]) -> dict | None:
    """The scheduler's clock over the timed decode tokens as ms per token, with the token's wall time and what the
    clock did not see (`rest`: the final wait for the last split, sampling-free decode bookkeeping, Python)."""
    if t is None or not per:
        return None
    n = len(per)
    d = {f: v * t.graphs / n for f, v in t.per_graph_ms().items()}
    seen = sum(v for f, v in d.items() if f.endswith("_ms"))
    d["wall_ms"] = 1000 * sum(per) / n
    d["rest_ms"] = d["wall_ms"] - seen
    return d


TIMING_HEADER = ("| slots | wall ms | CPU splits | CPU: wait for GPU | copy in | compute | GPU splits | GPU: wait | "
                 "copy in | launch | rest |\n|---|---|---|---|---|---|---|---|---|---|---|")


def render_timing(slots: int, d: dict) -> str:
    return (f"timing per token, ms: | {slots} | {d['wall_ms']:.2f} | {d['cpu_splits']:.0f} | {d['cpu_wait_ms']:.2f} | "
            f"{d['cpu_copy_ms']:.2f} | {d['cpu_compute_ms']:.2f} | {d['gpu_splits']:.0f} | {d['gpu_wait_ms']:.2f} | "
            f"{d['gpu_copy_ms']:.2f} | {d['gpu_launch_ms']:.2f} | {d['rest_ms']:.2f} |")


def render_row(r: BenchRow) -> str:
    return (f"| {r.slots} | {r.pack_mib:.0f} | {r.decode_tok_s:.1f} | {r.ms_per_token_median:.2f} | "
            f"{r.ms_per_token_p90:.2f} | {100 * r.hit_rate:.1f} % | {r.upload_mb_per_token:.2f} | "
            f"{r.prompt_tok_s:.0f} | {r.distinct_per_layer:.1f} / {100 * r.top10_share:.1f} % | {r.splits} |")


HEADER = ("| slots/layer | pack MiB | decode tok/s | ms/token median | p90 | hit rate | weights MB/token to GPU | "
          "prompt tok/s | routing: distinct/layer, top-10 % | splits/token |\n"
          "|---|---|---|---|---|---|---|---|---|---|")

COMPARE_HEADER = "| slots/layer | greedy tokens equal to 0 slots' | whole texts equal |\n|---|---|---|"


def render_compare_row(r: CompareRow) -> str:
    return f"| {r.slots} | {100 * r.agreement:.1f} % | {r.same_texts} of {r.prompts} |"


def render(rows: list[BenchRow], info: dict) -> str:
    prompt_path = "host experts streamed to the GPU" if info.get("op_offload", True) else "host experts on the CPU"
    head = (f"model {info['model']} ({info['arch']}, {info['n_layer']} layers, {info['n_expert']} experts, "
            f"k={info['k']}), {'mmap' if info['mmap'] else 'no mmap (pinned host)'}, threads {info['threads']}, "
            f"prompt {info['prompt_len']} ({prompt_path}), decode {info['n_decode']} random tokens, "
            f"stats {'on' if info['stats'] else 'off'}, "
            + ("every expert on the GPU (stock llama.cpp, no cache), " if info.get("all_gpu") else "")
            + f"routing: {info['routing']}; plan: per layer the top-S experts of a 0-slot pass over the same input "
            "(in-sample)")
    return "\n".join([head, HEADER] + [render_row(r) for r in rows])


def save(rows: list, info: dict, path: Path) -> None:
    path.write_text(json.dumps({"info": info, "rows": [dataclasses.asdict(r) for r in rows]}, indent=1))
