"""Shared by the exactness tests of every architecture: a fixed script of a 512-token prompt and decode batches of
1..64 tokens whose logits must be bit-identical to stock llama.cpp at 0, 1, k, E/2 and E slots (hot packs in host
memory on the CPU). Every batch size takes the two chains (no zero slot: a negative id selects no expert)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moeslots.engine import synth
from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.native.expert_cache import SlotPlan

PROMPT_LEN = 512                      # one ubatch of 512 rows through both chains
CHUNKS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64, 1]   # around the kernels' batch thresholds (4/5, 8/9, 16/17, 32)
N_CTX = 1024


def _tokens(n_vocab: int, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, n_vocab - len(synth.CONTROL_TOKENS), n)]


def run_script(ctx: Context, seed: int = 0, *, prompt_len: int = PROMPT_LEN,
               chunks: list[int] = CHUNKS) -> list[np.ndarray]:
    """Prompt (all rows output), then decode batches of 1..64 tokens; every row's logits, in order."""
    n_vocab = ctx.model.n_vocab
    out: list[np.ndarray] = []
    ctx.reset()
    prompt = _tokens(n_vocab, prompt_len, seed)
    ctx.decode(prompt, all_logits=True)
    out += [ctx.logits(i).copy() for i in range(len(prompt))]
    toks = _tokens(n_vocab, sum(chunks), seed + 1)
    pos = 0
    for c in chunks:
        ctx.decode(toks[pos:pos + c], all_logits=True)
        out += [ctx.logits(i).copy() for i in range(c)]
        pos += c
    return out


def assert_identical(a: list[np.ndarray], b: list[np.ndarray], what: str) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if not np.array_equal(x, y):
            d = float(np.max(np.abs(x - y)))
            raise AssertionError(f"{what}: row {i} differs (max |diff| {d:g})")


def _slot_counts(n_expert: int, k: int) -> list[int]:
    return sorted({0, 1, k, n_expert // 2, n_expert})


def exactness(path: Path, *, load_mtp: bool = False) -> None:
    with Model(path, LoadOptions(experts_on_host=True, load_mtp=load_mtp, extra_bufts=False)) as m:
        facts = m.facts
        layers = facts.moe_layers if load_mtp else [il for il in facts.moe_layers if il < facts.n_layer]
        with Context(m, n_ctx=N_CTX, n_batch=PROMPT_LEN, threads=2) as ctx:
            stock = run_script(ctx)
            for n in _slot_counts(facts.n_expert, facts.n_expert_used):
                line = m.set_slots(SlotPlan.uniform(layers, n, facts.n_expert, offset=n // 3), pack_host=True)
                if n:
                    assert line.startswith(f"expert cache: {len(layers)} layers x {n} slots, ")
                    assert "uploaded to host memory" in line
                assert_identical(stock, run_script(ctx), f"{path.name} at {n} slots")


