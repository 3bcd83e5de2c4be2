"""Synthetic models: writer, Q4_K blocks, tokenizer, realistic routing, load + deterministic generation."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from specs import KQ_GLM, TINY_GLM

from moeslots.engine import synth
from moeslots.engine.llm.facts import inspect_gguf
from moeslots.engine.llm.generate import greedy_stream, open_model
from moeslots.engine.llm.model import Context, LoadOptions, Model


def test_q4_k_blocks_are_zero_mean_with_the_asked_std() -> None:
    blocks = synth.q4_k_random_blocks(np.random.default_rng(0), 2048, 0.03)
    v = gguf.quants.dequantize(blocks.reshape(-1), gguf.GGMLQuantizationType.Q4_K)
    assert v.size == 2048 * 256
    assert abs(v.mean()) < 0.002
    assert v.std() == pytest.approx(0.03, rel=0.05)
    # every value is d*sc*(q - 7.5): per 32-value sub-block, v/step + 7.5 is an integer in 0..15
    sub = v[:32].astype(np.float64)
    step = np.min(np.abs(sub)) * 2          # |q - 7.5| >= 0.5
    q = sub / step + 7.5
    assert np.allclose(q, np.round(q), atol=1e-2) and q.min() >= -0.01 and q.max() <= 15.01


def test_tokenizer_has_bytes_merges_and_controls() -> None:
    tok = synth.build_tokenizer(400)
    assert len(tok.tokens) == 400 and len(set(tok.tokens)) == 400
    assert tok.tokens[-len(synth.CONTROL_TOKENS):] == synth.CONTROL_TOKENS
    assert tok.merges and all(len(m.split(" ")) == 2 for m in tok.merges)
    for m in tok.merges:   # every merge produces a token
        a, b = m.split(" ")
        assert a + b in tok.tokens


def test_header_facts(tiny_glm: Path, tiny_qwen: Path) -> None:
    f = inspect_gguf(tiny_glm)
    assert (f.arch, f.n_layer, f.n_nextn, f.n_expert, f.n_expert_used, f.n_dense_lead) == ("glm4moe", 3, 1, 16, 4, 1)
    assert f.moe_layers == [1, 2, 3]
    q = inspect_gguf(tiny_qwen)
    assert (q.arch, q.n_layer, q.n_nextn, q.moe_layers) == ("qwen3moe", 2, 0, [0, 1])


@pytest.mark.parametrize("fixture", ["tiny_glm", "tiny_qwen"])
def test_loads_and_generates_deterministically(fixture: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(fixture)
    runs = []
    for _ in range(2):
        om = open_model(path, n_ctx=256, threads=2)
        try:
            *_, stats = list(greedy_stream(om, "The expert cache", 24))
            runs.append(stats.token_ids)
            *_, again = list(greedy_stream(om, "The expert cache", 24))   # same context, reset in between
            assert again.token_ids == stats.token_ids
        finally:
            om.close()
    assert runs[0] == runs[1]
    assert len(runs[0]) > 0


def test_mtp_block_loads(tiny_glm: Path) -> None:
    with Model(tiny_glm, LoadOptions(load_mtp=True)) as m:
        assert m.mtp_loaded
        assert m._L.llama_model_n_layer_nextn(m.ptr) == 1


def test_routing_is_not_degenerate(tiny_glm: Path) -> None:
    rc = synth.routing_check(tiny_glm, n_tokens=128, threads=2)
    assert sorted(rc.distinct) == [1, 2]                 # trunk MoE layers (layer 0 dense; NextN not in trunk)
    assert not rc.degenerate, rc.render()
    assert rc.mean_distinct > 0.8 * rc.expected_distinct
    assert rc.mean_top10 < 0.35


def test_deep_model_routing_is_not_degenerate(models_dir: Path) -> None:
    """Deep random nets drift to one routing (48 layers on the H200 box: top 10 % = 72 % of picks) unless the
    residual branches are scaled down; 24 layers reproduce the drift on a CPU in seconds."""
    spec = synth.SynthSpec(arch="qwen3moe", n_layer=24, n_embd=128, n_head=4, n_head_kv=2, n_expert=32,
                           n_expert_used=4, n_ff_exp=64, n_vocab=400, nextn=False, dtype="f16", seed=2)
    p = synth.write_model(spec, models_dir / "deep.gguf").path
    rc = synth.routing_check(p, n_tokens=128, threads=2)
    assert len(rc.distinct) == 24
    assert not rc.degenerate, rc.render()
    assert min(rc.distinct.values()) > 0.8 * rc.expected_distinct, rc.render()
    assert max(rc.top10_share.values()) < 0.35, rc.render()


def test_degenerate_routing_is_flagged() -> None:
    picks = {1: np.tile(np.array([[0, 1, 2, 3]]), (200, 1))}
    rc = synth.summarize_routing(picks, 64, 4)
    assert rc.degenerate and "DEGENERATE" in rc.render()


def test_const_head_gives_equal_logits(models_dir: Path) -> None:
    spec = synth.SynthSpec(**{**TINY_GLM.__dict__, "const_head": True, "seed": 11})
    p = synth.write_model(spec, models_dir / "const-head.gguf").path
    with Model(p) as m, Context(m, n_ctx=128, threads=2) as ctx:
        ctx.decode(m.tokenize("hello there"))
        lg = ctx.logits()
        assert np.all(lg == lg[0])


@pytest.mark.parametrize("quant", ["q8_0", "q4_k_m"])
def test_quantized_through_the_engine(models_dir: Path, quant: str) -> None:
    p = synth.write_model(KQ_GLM, models_dir / f"kq-{quant}.gguf", quant=quant, threads=2).path
    r = gguf.GGUFReader(str(p))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    want = "Q8_0" if quant == "q8_0" else "Q4_K"
    assert types["blk.1.ffn_gate_exps.weight"] == want
    assert types["blk.1.ffn_gate_inp.weight"] == "F32"         # router stays exact
    om = open_model(p, n_ctx=128, threads=2)
    try:
        *_, st = list(greedy_stream(om, "code", 8))
        assert st.tokens > 0
    finally:
        om.close()


def test_direct_q4_k_model_loads_and_routes(models_dir: Path) -> None:
    spec = synth.SynthSpec(**{**KQ_GLM.__dict__, "n_expert": 32, "seed": 9})
    p = synth.write_model(spec, models_dir / "direct-q4k.gguf", quant="q4_k").path
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(p)).tensors}
    assert types["blk.1.ffn_up_exps.weight"] == "Q4_K" and types["blk.1.ffn_gate_inp.weight"] == "F32"
    rc = synth.routing_check(p, n_tokens=128, threads=2)
    assert not rc.degenerate, rc.render()


def test_writer_streams_and_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "m.gguf"
    calls = []

    def boom(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        synth.write_model(TINY_GLM, out, progress=boom)
    assert not out.exists() and not list(tmp_path.glob("*.part"))   # no half-written model left behind
    assert calls == sorted(calls)


def test_big_vocabularies_keep_filler_tokens_short() -> None:
    """A Qwen-sized vocabulary (248k): every filler token a few letters, so a reply of random tokens re-tokenizes to
    a few tokens each (long filler made a 128-token reply re-read as ~11,000 tokens on the next chat turn)."""
    tok = synth.build_tokenizer(248_320)
    assert len(tok.tokens) == len(set(tok.tokens)) == 248_320
    normal = [t for t, ty in zip(tok.tokens, tok.types) if ty == 1]
    assert max(len(t) for t in normal) <= 10 and sum(map(len, normal)) / len(normal) < 5.5
