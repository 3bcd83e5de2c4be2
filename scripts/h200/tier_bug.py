"""The host tier's verify-batch failure on CUDA (engine/patches/README.md, known gaps), taken apart: the tier of
`tests/engine/test_native_tier.py::test_the_tier_keeps_logits_exact[2]` (the tiny qwen, 6 slots = 4 core + 2 tier,
EVEN costs, the pack on the GPU) with LLAMA_MOESLOTS_TIER_GPU_BATCHES=1, so that verify batches step it as they did
when it failed. Prints, against the stock run of the same script:
  E0  every row whose logits differ by more than GPU rounding (2e-2 of the row's scale), and the first one;
  E1  per decode position, the layers whose routed experts differ from stock's (the stats ring): a row that differs
      with the same routing in every layer is not a routing flip; a flip shows as a changed layer at that row;
  E1b the same script with routing fixed by a replay table taken from the stock run: a failure that remains is not
      a flip (bad pack bytes, or a kernel);
Without a GPU the pack is in host memory and every row must be identical (a check of the script itself). Run with
the CUDA engine installed, from the repository root (scripts/h200/tier-bug.sh runs it twice, the second
time with GGML_CUDA_DISABLE_FUSION=1, ggml-cuda's switch for its op fusions: E3).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from exactness import run_script  # noqa: E402
from specs import TINY_QWEN  # noqa: E402

from moeslots.engine import synth  # noqa: E402
from moeslots.engine.llm.model import Context, LoadOptions, Model  # noqa: E402
from moeslots.engine.native import lib as native  # noqa: E402
from moeslots.engine.native import replay  # noqa: E402
from moeslots.engine.native import tier as native_tier  # noqa: E402
from moeslots.engine.native.expert_cache import SlotPlan  # noqa: E402
from moeslots.profiles.costs import CostModel  # noqa: E402

EVEN = CostModel(slab_mb=1.0, cpu_gbps=1.0, pcie_gbps=1.0, gpu_gbps=1000.0, base_ms=1.0)
CHUNKS = [1, 2, 1, 1, 3, 1, 1, 1, 5, 1, 1, 1, 8, 1, 1, 1]
PROMPT = 20
PACK_HOST = not native.gpus()      # no GPU: the pack in host memory (every row must then be identical)


def rel(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30))


def routes(ring: np.ndarray, k: int) -> dict[tuple[int, int], tuple[int, ...]]:
    """(decode position, layer) -> the sorted experts the stats ring recorded."""
    return {(int(r[0]), int(r[1])): tuple(sorted(int(e) for e in r[2:2 + k])) for r in ring if r[0] >= 0}


def table_of(ring: np.ndarray, n_layer: int, k: int) -> replay.ReplayTable:
    """The routing a run's stats ring recorded, prompt and decode positions, as a replay table (row = position)."""
    pos = np.where(ring[:, 0] >= 0, ring[:, 0], -ring[:, 0] - 1)
    ids = np.zeros((int(pos.max()) + 1, n_layer, k), np.int32)
    ids[pos, ring[:, 1]] = ring[:, 2:2 + k]
    return replay.ReplayTable(ids, "the stock run's routing")


def one(ctx: Context, m: Model, tier: int | None, table: replay.ReplayTable | None) -> tuple[list, np.ndarray]:
    f = m.facts
    replay.set_replay(ctx.ptr, table)
    if tier is None:
        m.set_slots(SlotPlan({}), pack_host=PACK_HOST)
        out = run_script(ctx, 0, prompt_len=PROMPT, chunks=CHUNKS)
        return out, ctx.read_stats().ring.copy()
    plan = SlotPlan.uniform(f.moe_layers, 6, f.n_expert)
    m.set_slots(plan, pack_host=PACK_HOST)
    t = native_tier.NativeTier(m.ptr, plan, tier, EVEN)
    try:
        out = run_script(ctx, 0, prompt_len=PROMPT, chunks=CHUNKS)
        t.step()
        print(f"  tier counts: {t.counts}")
    finally:
        t.close()
    return out, ctx.read_stats().ring.copy()


def report(name: str, stock: list, got: list, r_stock: np.ndarray, r_got: np.ndarray, k: int) -> None:
    bad = [(i, rel(x, y)) for i, (x, y) in enumerate(zip(stock, got)) if rel(x, y) >= 2e-2]
    print(f"{name}: {len(bad)} of {len(stock)} rows differ beyond GPU rounding"
          + (f"; first row {bad[0][0]} ({bad[0][1]:.3g} of its scale)" if bad else ""))
    for i, d in bad[:12]:
        print(f"  row {i}: {d:.3g}")
    a, b = routes(r_stock, k), routes(r_got, k)
    flips: dict[int, list[int]] = {}
    for key in sorted(set(a) & set(b)):
        if a[key] != b[key]:
            flips.setdefault(key[0], []).append(key[1])
    print(f"  positions whose routing differs from stock's ({len(set(a) & set(b))} (position, layer) pairs compared): "
          + (", ".join(f"pos {p} (layers {ls})" for p, ls in sorted(flips.items())[:12]) or "none"))


def main() -> None:
    os.environ.setdefault("LLAMA_MOESLOTS_TIER_GPU_BATCHES", "1")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / "tier-bug"
    out.mkdir(parents=True, exist_ok=True)
    path = synth.write_model(TINY_QWEN, out / "tiny-qwen3moe.gguf").path
    with Model(path, LoadOptions(extra_bufts=False)) as m, Context(m, n_ctx=256, threads=2) as ctx:
        k = m.facts.n_expert_used
        ctx.enable_stats(ring_rows=8192)
        stock, r_stock = one(ctx, m, None, None)
        got, r_got = one(ctx, m, 2, None)
        report("E0/E1 tier of 2, routing free", stock, got, r_stock, r_got, k)
        # E1b: the stock run's routing replayed into both runs
        table = table_of(r_stock, m.facts.n_layer, k)
        s2, rs2 = one(ctx, m, None, table)
        g2, rg2 = one(ctx, m, 2, table)
        report("E1b tier of 2, routing replayed from stock", s2, g2, rs2, rg2, k)
        replay.set_replay(ctx.ptr, None)


if __name__ == "__main__":
    main()
