"""Every residency policy's logits against static's, per decode batch size, within the gap stock llama.cpp itself
shows between two placements of the same model: all experts with their layers (on the GPU where there is one) and
every expert in host memory (`-ot exps=CPU`). Where the experts are computed is not math, so a policy may differ
from static only by the rounding that moving an expert between devices brings, and stock's own placements measure
it. On a CPU-only engine both placements compute on the CPU: the gap is 0 and every policy must be bit-identical.

The script: a prompt of 20 tokens, then decode batches of 1 to 8 tokens with every row an output, as MTP's verify
batches are (each size several times, one-token batches between them). One PASS or FAIL line per policy and batch
size. Then, for a model with a NextN block, MTP itself: greedy decoding with 3 drafts a step under each policy must
give static's tokens (for as many tokens as stock's two placements agree on). Then a count; exit status 1 when any
failed.

    python -P -m moeslots.engine.bench.policycheck [MODEL.gguf] [--slots S] [--threads T]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import Callable, Iterator, Sequence, Union

import numpy as np

from ...profiles.costs import CostModel
from ..llm.facts import inspect_gguf
from ..llm.model import Context, LoadOptions, Model
from ..llm.mtp import MTP, MTPStats, greedy_tokens
from ..native import lib as native
from ..native import tier as native_tier
from ..native.expert_cache import SlotPlan

SIZES = tuple(range(1, 9))
CHUNKS = [n for size in SIZES for n in (size, 1, size, 1)]
PROMPT = 20
# a tier that splits its misses between the CPU and uploads (hybrid, fetch-split: both sides get some)
EVEN = CostModel(slab_mb=1.0, cpu_gbps=1.0, pcie_gbps=1.0, gpu_gbps=1000.0, base_ms=1.0, fetch_gbps=1.0)
SLACK = 1.5         # a policy's difference may reach this many times stock's own placement gap
MTP_TOKENS = 48     # greedy tokens decoded with MTP drafts per policy
MTP_DRAFTS = 3


@dataclasses.dataclass(frozen=True)
class Case:
    policy: str
    size: int                   # decode batch size (tokens)
    diff: float                 # the largest relative difference of a row's logits from static's
    allowed: float              # the most it may be

    @property
    def ok(self) -> bool:
        return self.diff <= self.allowed

    def line(self) -> str:
        return (f"{'PASS' if self.ok else 'FAIL'} {self.policy:<11} batch {self.size}: {self.diff:.3g} of the "
                f"logits' scale (allowed {self.allowed:.3g})")


@dataclasses.dataclass(frozen=True)
class MtpCase:
    policy: str
    agree: int                  # leading greedy tokens equal to static's
    need: int                   # how many must be (stock's placements agree on that many)
    acceptance: float           # share of drafts accepted

    @property
    def ok(self) -> bool:
        return self.agree >= self.need

    def line(self) -> str:
        return (f"{'PASS' if self.ok else 'FAIL'} {self.policy:<11} MTP: {self.agree} tokens as static's (needed "
                f"{self.need}), {100 * self.acceptance:.0f} % of drafts accepted")


def _tokens(n_vocab: int, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, n_vocab - 16, n)]


def script(ctx: Context) -> list[tuple[int, np.ndarray]]:
    """(batch size, logits) of every row: the prompt's (size 0), then each decode batch's."""
    ctx.reset()
    prompt = _tokens(ctx.model.n_vocab, PROMPT, 0)
    ctx.decode(prompt, all_logits=True)
    out = [(0, ctx.logits(i).copy()) for i in range(PROMPT)]
    toks = _tokens(ctx.model.n_vocab, sum(CHUNKS), 1)
    pos = 0
    for c in CHUNKS:
        ctx.decode(toks[pos:pos + c], all_logits=True)
        out += [(c, ctx.logits(i).copy()) for i in range(c)]
        pos += c
    return out


def row_diff(a: np.ndarray, b: np.ndarray) -> float:
    """The largest difference of two rows of logits relative to the reference row's scale."""
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-30))


def by_size(ref: Sequence[tuple[int, np.ndarray]], got: Sequence[tuple[int, np.ndarray]]) -> dict[int, float]:
    """The largest row difference per decode batch size (the prompt's rows under 0)."""
    if [s for s, _ in ref] != [s for s, _ in got]:
        raise ValueError("the two runs decoded different batches")
    out: dict[int, float] = {}
    for (s, a), (_, b) in zip(ref, got):
        out[s] = max(out.get(s, 0.0), row_diff(a, b))
    return out


def cases(policy: str, diffs: dict[int, float], allowed: float) -> list[Case]:
    return [Case(policy, s, diffs.get(s, 0.0), allowed) for s in SIZES]


def placement_gap(path: Path, threads: int, gpu: bool) -> float:
    """Stock's own difference between its two placements over the script (0 without a GPU: both on the CPU)."""
    if not gpu:
        return 0.0
    runs = []
    for on_host in (False, True):
        with Model(path, LoadOptions(experts_on_host=on_host)) as m, Context(m, n_ctx=256, threads=threads) as ctx:
            runs.append(script(ctx))
    return max(by_size(runs[0], runs[1]).values())


def policies(slots: int) -> dict[str, Callable[[Model], native_tier.NativeTier | None]]:
    """Each policy as what it puts on a model whose slots are in: nothing (static) or a tier."""
    hybrid = max(1, slots // 4)
    return {
        "static": lambda m: None,
        "hybrid": lambda m: native_tier.NativeTier(m.ptr, _plan(m, slots), hybrid, EVEN),
        "dynamic": lambda m: native_tier.NativeTier(m.ptr, _plan(m, slots), slots, EVEN),
        "fetch": lambda m: native_tier.NativeTier(m.ptr, _plan(m, slots), slots // 2, EVEN, device=True),
        "fetch-split": lambda m: native_tier.NativeTier(m.ptr, _plan(m, slots), slots // 2, EVEN, device=True,
                                                        share=True),
    }


@contextlib.contextmanager
def _policy_on(m: Model, make: Callable[[Model], native_tier.NativeTier | None], slots: int, gpu: bool,
               ) -> Iterator[native_tier.NativeTier | None]:
    """The model's slots planned and the policy's tier on (None: static) while the block runs; the tier off after."""
    m.set_slots(_plan(m, slots), pack_host=not gpu)
    t = make(m)
    try:
        yield t
    finally:
        if t is not None:
            t.close()


def _agree(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def mtp_cases(path: Path, slots: int, threads: int, gpu: bool, say: Callable[[str], None]) -> list[MtpCase]:
    """MTP greedy decoding under each policy against static's (see the module's text); none without a NextN block."""
    f = inspect_gguf(path)
    if not (f.n_nextn and f.nextn_tensors):
        say(f"     MTP: {path.name} has no NextN block: not checked")
        return []
    need = MTP_TOKENS
    if gpu:                                          # stock's own placements: how long their greedy texts agree
        texts = []
        for on_host in (False, True):
            with Model(path, LoadOptions(experts_on_host=on_host, load_mtp=True)) as m, \
                    Context(m, n_ctx=256, threads=threads) as ctx:
                mtp = MTP(m, ctx, MTP_DRAFTS, threads)
                try:
                    texts.append(greedy_tokens(mtp, _tokens(m.n_vocab, PROMPT, 2), MTP_TOKENS, lambda t: False))
                finally:
                    mtp.close()
        need = _agree(*texts)
    out: list[MtpCase] = []
    with Model(path, LoadOptions(use_mmap=False, extra_bufts=gpu, load_mtp=True)) as m, \
            Context(m, n_ctx=256, threads=threads) as ctx:
        mtp = MTP(m, ctx, MTP_DRAFTS, threads)
        toks = _tokens(m.n_vocab, PROMPT, 2)
        ref: list[int] | None = None
        try:
            for name, make in policies(slots).items():
                mtp.stats = MTPStats()
                try:
                    with _policy_on(m, make, slots, gpu):
                        got = greedy_tokens(mtp, toks, MTP_TOKENS, lambda t: False)
                except Exception as e:  # noqa: BLE001 - a policy this engine or device refuses is a failed case
                    got, why = [], f" ({e})"
                else:
                    why = ""
                ref = got if ref is None else ref
                out.append(MtpCase(name, _agree(ref, got), need, mtp.stats.acceptance))
                say(out[-1].line() + why)
        finally:
            mtp.close()
            m.set_slots(SlotPlan({}), pack_host=not gpu)
    return out


def _plan(m: Model, slots: int) -> SlotPlan:
    f = m.facts
    return SlotPlan.uniform([il for il in f.moe_layers if il < f.n_layer], slots, f.n_expert)


def run(path: Path, slots: int, threads: int, say: Callable[[str], None] = print,
        moved: dict[str, tuple[int, int]] | None = None) -> list[Union[Case, MtpCase]]:
    """Every case, said one line each; moved (when given) gets each tier's (uploads, CPU misses): a tier that moved
    nothing would pass trivially."""
    moved = {} if moved is None else moved
    gpu = bool(native.gpus())
    gap = placement_gap(path, threads, gpu)
    allowed = SLACK * gap
    where = "a GPU" if gpu else "no GPU (packs in host memory)"
    say(f"{path.name}: {slots} slots per layer, {threads} threads, {where}; stock's placement gap {gap:.3g} of the "
        f"logits' scale")
    out: list[Union[Case, MtpCase]] = []
    # pinned host experts (no mmap): what the GPU-stepped tiers read; the same memory for every policy
    with Model(path, LoadOptions(use_mmap=False, extra_bufts=gpu)) as m, Context(m, n_ctx=256, threads=threads) as ctx:
        ref: list[tuple[int, np.ndarray]] | None = None
        for name, make in policies(slots).items():
            try:
                with _policy_on(m, make, slots, gpu) as t:
                    got = script(ctx)
                    if t is not None:
                        t.step(force=True)
                        c = t.counts
                        moved[name] = (c.uploads, c.cpu)
                        say(f"     {name:<11} moved {c.uploads} experts into its tier and left {c.cpu} misses to "
                            f"the CPU")
            except Exception as e:  # noqa: BLE001 - a policy this engine or device refuses is a failed case
                out += [Case(name, s, float("inf"), allowed) for s in SIZES]
                say(f"FAIL {name:<11} refused: {e}")
                continue
            if ref is None:
                ref = got
            for case in cases(name, by_size(ref, got), allowed):
                out.append(case)
                say(case.line())
        m.set_slots(SlotPlan({}), pack_host=not gpu)
    out += mtp_cases(path, slots, threads, gpu, say)
    n_fail = sum(not c.ok for c in out)
    say(f"{len(out) - n_fail} passed, {n_fail} failed")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from ..machine import bundled

    ap = argparse.ArgumentParser(prog="policycheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path, default=None, help="a GGUF (default: the bundled model)")
    ap.add_argument("--slots", type=int, default=8, help="slots per MoE layer (default 8)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    out = run(a.model or bundled.model(), a.slots, a.threads)
    return 1 if any(not c.ok for c in out) else 0


if __name__ == "__main__":
    sys.exit(main())
