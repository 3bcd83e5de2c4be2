"""The ggml op test of GGML_OP_MOE_FETCH (tests/engine/moe_fetch_op.cpp), built against the installed engine's ggml
and run on the CPU backend: five shapes (16-256 experts, k 4-8, tiers of 4-64 slots with free slots at the start,
F32 and odd-length I8 slabs), 200 steps each of one-token and batched steps and read-only batches, every result and
the final map, state and pack bytes equal to a reference written from the op's contract. The same program runs over
CUDA on the H200 (scripts/h200/fetch-op.sh)."""

from __future__ import annotations

from pathlib import Path

from test_mmid_op import run_op_test_on_cpu

SOURCE = Path(__file__).with_name("moe_fetch_op.cpp")


def test_the_fetch_op_follows_its_contract_on_the_cpu(tmp_path: Path) -> None:
    out = run_op_test_on_cpu(tmp_path, SOURCE, "moe_fetch_op")
    assert "12 passed, 0 failed" in out
