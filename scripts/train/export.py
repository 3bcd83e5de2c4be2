"""Export trained weights (weights.pt or ckpt.pt) + tokenizer.json to a `glm4moe` GGUF with its NextN block.

Every topology of model.TOPOLOGIES is written as glm4moe: the gating function (sigmoid or softmax) goes in the header,
Q/K norms and Q/K/V biases are written when the model has them, and a model without a shared expert gets an
all-zero one (glm4moe's loader requires the tensors; zero weights add exactly 0).

F32 export first (every tensor as trained, float16-rounded weights widened to float32); `--quant q4_k_m` then
quantizes it with the patched engine (llama.cpp's own quantizer) into the shipped file.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import gguf
import numpy as np
import torch
from model import Config
from tok import CHAT_TEMPLATE, SPECIALS


def load_weights(path: Path) -> tuple[Config, dict[str, np.ndarray]]:
    c = torch.load(path, map_location="cpu", weights_only=False)
    sd = c["weights"] if "weights" in c else c["model"]
    return Config(**c["config"]), {k: v.float().numpy() for k, v in sd.items()}


def tensors(c: Config, w: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, array) in GGUF order; numpy shapes are torch shapes (ggml ne reversed)."""
    out = [("token_embd.weight", w["embed.weight"]), ("output_norm.weight", w["out_norm"]),
           ("output.weight", w["output.weight"])]

    def block(i: int, p: str) -> None:
        b = f"blk.{i}."
        out.extend([(b + "attn_norm.weight", w[p + "attn_norm"])])
        for n in ("q", "k", "v"):
            out.append((b + f"attn_{n}.weight", w[p + f"attn.{n}.weight"]))
            if p + f"attn.{n}.bias" in w:
                out.append((b + f"attn_{n}.bias", w[p + f"attn.{n}.bias"]))
        for n in ("q", "k"):
            if p + f"attn.{n}_norm" in w:
                out.append((b + f"attn_{n}_norm.weight", w[p + f"attn.{n}_norm"]))
        out.append((b + "attn_output.weight", w[p + "attn.o.weight"]))
        out.append((b + "post_attention_norm.weight", w[p + "post_norm"]))
        f = p + "ffn."
        if f + "router.weight" in w:
            out.extend([(b + "ffn_gate_inp.weight", w[f + "router.weight"]),
                        (b + "exp_probs_b.bias", w[f + "sel_bias"]),
                        (b + "ffn_gate_exps.weight", w[f + "gate"]),
                        (b + "ffn_up_exps.weight", w[f + "up"]),
                        (b + "ffn_down_exps.weight", w[f + "down"])])
            zero_in = np.zeros((c.n_ff_exp, c.n_embd), np.float32)
            out.extend([(b + "ffn_gate_shexp.weight", w.get(f + "shared.gate.weight", zero_in)),
                        (b + "ffn_up_shexp.weight", w.get(f + "shared.up.weight", zero_in)),
                        (b + "ffn_down_shexp.weight", w.get(f + "shared.down.weight", zero_in.T.copy()))])
        else:
            out.extend([(b + "ffn_gate.weight", w[f + "gate.weight"]), (b + "ffn_up.weight", w[f + "up.weight"]),
                        (b + "ffn_down.weight", w[f + "down.weight"])])

    for i in range(c.n_layer):
        block(i, f"blocks.{i}.")
    n = c.n_layer
    block(n, "nextn.block.")
    out.extend([(f"blk.{n}.nextn.eh_proj.weight", w["nextn.eh_proj.weight"]),
                (f"blk.{n}.nextn.enorm.weight", w["nextn.enorm"]),
                (f"blk.{n}.nextn.hnorm.weight", w["nextn.hnorm"]),
                (f"blk.{n}.nextn.shared_head_norm.weight", w["nextn.head_norm"])])
    return out


def gpt2_vocab(tokenizer: Path) -> tuple[list[str], list[int], list[str]]:
    j = json.loads(tokenizer.read_text())
    vocab: dict[str, int] = dict(j["model"]["vocab"])
    for t in j["added_tokens"]:
        vocab[t["content"]] = t["id"]
    toks = [""] * len(vocab)
    for s, i in vocab.items():
        toks[i] = s
    types = [gguf.TokenType.CONTROL if s in SPECIALS else gguf.TokenType.NORMAL for s in toks]
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return toks, [int(t) for t in types], merges


def write_meta(wr: gguf.GGUFWriter, c: Config, tokenizer: Path, name: str, ftype: int) -> None:
    wr.add_name(name)
    wr.add_block_count(c.n_layer + 1)
    wr.add_context_length(c.n_ctx)
    wr.add_embedding_length(c.n_embd)
    wr.add_feed_forward_length(c.n_ff)
    wr.add_head_count(c.n_head)
    wr.add_head_count_kv(c.n_head_kv)
    wr.add_key_length(c.head_dim)
    wr.add_value_length(c.head_dim)
    wr.add_rope_dimension_count(c.n_rot)
    wr.add_rope_freq_base(c.rope_base)
    wr.add_layer_norm_rms_eps(c.eps)
    wr.add_expert_count(c.n_expert)
    wr.add_expert_used_count(c.n_expert_used)
    wr.add_expert_feed_forward_length(c.n_ff_exp)
    wr.add_expert_shared_count(1)            # glm4moe needs one; the donor's is all zeros (tensors())
    wr.add_leading_dense_block_count(c.n_dense_lead)
    wr.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX if c.gating == "softmax"
                              else gguf.ExpertGatingFuncType.SIGMOID)
    wr.add_expert_weights_norm(True)
    wr.add_expert_weights_scale(1.0)
    wr.add_nextn_predict_layers(1)
    toks, types, merges = gpt2_vocab(tokenizer)
    assert len(toks) == c.vocab, (len(toks), c.vocab)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("gpt-2")
    wr.add_token_list(toks)
    wr.add_token_types(types)
    wr.add_token_merges(merges)
    wr.add_bos_token_id(0)
    wr.add_eos_token_id(0)
    wr.add_add_bos_token(False)
    wr.add_chat_template(CHAT_TEMPLATE)
    wr.add_file_type(ftype)


def finish(wr: gguf.GGUFWriter, out: Path) -> None:
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(str(out) + ".part", out)


def write_f32(c: Config, w: dict[str, np.ndarray], tokenizer: Path, out: Path, name: str) -> None:
    wr = gguf.GGUFWriter(str(out) + ".part", "glm4moe")
    write_meta(wr, c, tokenizer, name, gguf.LlamaFileType.ALL_F32)
    for n, a in tensors(c, w):
        wr.add_tensor(n, np.ascontiguousarray(a, dtype=np.float32))
    finish(wr, out)


# The shipped mix: routed experts as llama.cpp's Q5_K_M quantizer writes them (Q5_K; the down matrices, whose rows
# of 64 are too short for K-quants, as Q5_1/Q8_0), every other matrix Q8_0, norms/routers/biases F32. Measured on
# the trained model (docs/model.md): Q4_K_M 18.1 MiB / 89.5 % top-1 agreement with F32, Q5_K_M 20.5 / 93.9 %,
# Q6_K 24.1 / 95.5 %, Q8_0 28.8 / 97.6 %; the mix keeps the small, sensitive matrices at 8 bits.
MIX = {"experts": 17, "rest": 7}        # llama_ftype: 17 = MOSTLY_Q5_K_M, 7 = MOSTLY_Q8_0


def write_mix(c: Config, f32: Path, tokenizer: Path, out: Path, name: str, threads: int | None = None) -> None:
    """Quantize f32 twice with the engine's quantizer and take each tensor from the file its role asks for."""
    from moeslots.engine.native import lib as native

    L = native.llama()
    parts = {}
    for role, ftype in MIX.items():
        p = L.llama_model_quantize_default_params()
        p.ftype = ftype
        p.nthread = threads or (os.cpu_count() or 1)
        dst = out.with_name(out.name + f".{role}.tmp")
        if L.llama_model_quantize(str(f32).encode(), str(dst).encode(), p) != 0:
            raise RuntimeError(f"quantizing {f32} (ftype {ftype}) failed: {native.recent_log(3)}")
        parts[role] = dst
    try:
        src = {role: {t.name: t for t in gguf.GGUFReader(str(p)).tensors} for role, p in parts.items()}
        wr = gguf.GGUFWriter(str(out) + ".part", "glm4moe")
        write_meta(wr, c, tokenizer, name, gguf.LlamaFileType.MOSTLY_Q5_K_M)
        for n in src["rest"]:
            t = src["experts" if "_exps." in n else "rest"][n]
            wr.add_tensor(n, np.asarray(t.data), raw_dtype=t.tensor_type)
        finish(wr, out)
    finally:
        for p in parts.values():
            p.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("weights", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("-o", "--out", type=Path, required=True, help="F32 GGUF")
    ap.add_argument("--quant", choices=["mix", "q4_k_m", "q8_0"],
                    help="also write a quantized copy (needs moeslots); mix: the shipped Q5_K experts + Q8_0 rest")
    ap.add_argument("--quant-out", type=Path)
    ap.add_argument("--name", default="moeslots-tiny-glm4moe")
    a = ap.parse_args()
    c, w = load_weights(a.weights)
    write_f32(c, w, a.tokenizer, a.out, a.name)
    print(f"wrote {a.out} ({a.out.stat().st_size / 2**20:.1f} MiB)")
    if a.quant:
        q = a.quant_out or a.out.with_name(a.out.stem + f"-{a.quant}.gguf")
        if a.quant == "mix":
            write_mix(c, a.out, a.tokenizer, q, a.name)
        else:
            from moeslots.engine.synth import quantize

            quantize(a.out, q, a.quant)
        print(f"wrote {q} ({q.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
