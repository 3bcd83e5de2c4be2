"""The ggml op test of GGML_OP_MOE_FETCH_JOIN (tests/engine/moe_join_op.cpp), built against the installed engine's ggml
and run on the CPU backend: four shapes (a 30B-A3B layer's share for one token and a verify batch, small ones, one
off the kernel's vector path), each answered before the graph, 50 ms into it, after a stale done word, never, and
given up: every result bit for bit the reference's, the waits waited, the one never answered given up after its
timeout with the failed word set and the graph failed, the one given up failed at once. The same program runs over
CUDA on the GPU box (scripts/h200/fetch-op.sh)."""

from __future__ import annotations

from pathlib import Path

from test_mmid_op import run_op_test_on_cpu

SOURCE = Path(__file__).with_name("moe_join_op.cpp")


def test_the_join_op_follows_its_contract_on_the_cpu(tmp_path: Path) -> None:
    out = run_op_test_on_cpu(tmp_path, SOURCE, "moe_join_op")
    assert "20 passed, 0 failed" in out
