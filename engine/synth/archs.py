"""Per architecture: the tensors a synthetic model carries (names and shapes as the vendored llama.cpp loads them)
and its header keys. Values come later (writer.tensor_values), from each tensor's kind and std."""

from __future__ import annotations

import numpy as np

from .spec import SynthSpec, TensorPlan
from .tokenizer import CHAT_TEMPLATE, Tokenizer


def _mat(name: str, n_in: int, n_out: int, scale: float = 1.0) -> TensorPlan:
    return TensorPlan(name, (n_in, n_out), "matrix", scale / np.sqrt(n_in))


def _norm(name: str, n: int, zero: bool = False) -> TensorPlan:
    return TensorPlan(name, (n,), "zero" if zero else "norm")


def _experts(spec: SynthSpec, p: str) -> list[TensorPlan]:
    E, F, X, b = spec.n_embd, spec.n_ff_exp, spec.n_expert, spec.branch
    t = [TensorPlan(p + "ffn_gate_inp.weight", (E, X), "router", 1 / np.sqrt(E))]
    if spec.arch in ("glm4moe", "deepseek2"):
        t.append(TensorPlan(p + "exp_probs_b.bias", (X,), "zero" if spec.arch == "glm4moe" else "bias", 0.1))
    if spec.merged_gate_up:
        t.append(TensorPlan(p + "ffn_gate_up_exps.weight", (E, 2 * F, X), "matrix", 1 / np.sqrt(E)))
    else:
        t += [TensorPlan(p + "ffn_gate_exps.weight", (E, F, X), "matrix", 1 / np.sqrt(E)),
              TensorPlan(p + "ffn_up_exps.weight", (E, F, X), "matrix", 1 / np.sqrt(E))]
    t.append(TensorPlan(p + "ffn_down_exps.weight", (F, E, X), "matrix", b / np.sqrt(F)))
    if spec.arch in ("glm4moe", "deepseek2", "qwen35moe", "llama4"):
        S = spec.shexp if spec.arch == "qwen35moe" else F
        if spec.arch == "qwen35moe":
            t.append(TensorPlan(p + "ffn_gate_inp_shexp.weight", (E,), "matrix", 1 / np.sqrt(E)))
        t += [_mat(p + "ffn_gate_shexp.weight", E, S), _mat(p + "ffn_up_shexp.weight", E, S),
              _mat(p + "ffn_down_shexp.weight", S, E, b)]
    return t


def _dense_ffn(spec: SynthSpec, p: str) -> list[TensorPlan]:
    E, F = spec.n_embd, spec.n_ff
    return [_mat(p + "ffn_gate.weight", E, F), _mat(p + "ffn_up.weight", E, F),
            _mat(p + "ffn_down.weight", F, E, spec.branch)]


def _nextn(spec: SynthSpec, p: str) -> list[TensorPlan]:
    E = spec.n_embd
    return [_mat(p + "nextn.eh_proj.weight", 2 * E, E), _norm(p + "nextn.enorm.weight", E),
            _norm(p + "nextn.hnorm.weight", E), _norm(p + "nextn.shared_head_norm.weight", E, spec.const_head)]


def _gqa_attention(spec: SynthSpec, p: str, q_mult: int = 1) -> list[TensorPlan]:
    E, hd = spec.n_embd, spec.hd
    q_dim, kv_dim = spec.n_head * hd, spec.n_head_kv * hd
    return [_mat(p + "attn_q.weight", E, q_mult * q_dim), _mat(p + "attn_k.weight", E, kv_dim),
            _mat(p + "attn_v.weight", E, kv_dim), _mat(p + "attn_output.weight", q_dim, E, spec.branch)]


def _delta_net(spec: SynthSpec, p: str) -> list[TensorPlan]:
    """qwen35moe's gated delta-net layer (llama.cpp: build_layer_attn_linear)."""
    E, b = spec.n_embd, spec.branch
    key_dim, value_dim = spec.ssm_state * spec.ssm_groups, spec.ssm_state * spec.ssm_v_heads
    conv_dim = 2 * key_dim + value_dim
    return [_mat(p + "attn_qkv.weight", E, conv_dim), _mat(p + "attn_gate.weight", E, value_dim),
            TensorPlan(p + "ssm_conv1d.weight", (spec.ssm_conv, conv_dim), "conv", 1 / np.sqrt(spec.ssm_conv)),
            TensorPlan(p + "ssm_dt.bias", (spec.ssm_v_heads,), "fill", spec.ssm_dt_bias),
            TensorPlan(p + "ssm_a", (spec.ssm_v_heads,), "decay"),
            _mat(p + "ssm_beta.weight", E, spec.ssm_v_heads), _mat(p + "ssm_alpha.weight", E, spec.ssm_v_heads),
            _norm(p + "ssm_norm.weight", spec.ssm_state), _mat(p + "ssm_out.weight", value_dim, E, b)]


def _mla(spec: SynthSpec, p: str) -> list[TensorPlan]:
    """deepseek2's multi-head latent attention with absorbed K/V up-projections (k_b, v_b)."""
    E, H, b = spec.n_embd, spec.n_head, spec.branch
    k_mla = spec.qk_nope + spec.rot
    return [_norm(p + "attn_q_a_norm.weight", spec.q_lora), _norm(p + "attn_kv_a_norm.weight", spec.kv_lora),
            _mat(p + "attn_q_a.weight", E, spec.q_lora), _mat(p + "attn_q_b.weight", spec.q_lora, H * k_mla),
            _mat(p + "attn_kv_a_mqa.weight", E, spec.kv_lora + spec.rot),
            TensorPlan(p + "attn_k_b.weight", (spec.qk_nope, spec.kv_lora, H), "matrix", 1 / np.sqrt(spec.qk_nope)),
            TensorPlan(p + "attn_v_b.weight", (spec.kv_lora, spec.v_head, H), "matrix", 1 / np.sqrt(spec.kv_lora)),
            _mat(p + "attn_output.weight", H * spec.v_head, E, b)]


def tensor_plan(spec: SynthSpec) -> list[TensorPlan]:
    E, V, hd = spec.n_embd, spec.n_vocab, spec.hd
    t: list[TensorPlan] = [TensorPlan("token_embd.weight", (E, V), "embed", 1.0),
                           _norm("output_norm.weight", E, spec.const_head), _mat("output.weight", E, V)]
    for i in range(spec.n_block):
        p = f"blk.{i}."
        if i >= spec.n_layer and not spec.nextn_tensors:
            continue
        t.append(_norm(p + "attn_norm.weight", E))
        if spec.arch == "deepseek2":
            t += _mla(spec, p) + [_norm(p + "ffn_norm.weight", E)]
        elif spec.is_recurrent(i):
            t += _delta_net(spec, p) + [_norm(p + "post_attention_norm.weight", E)]
        elif spec.arch == "qwen35moe":
            t += _gqa_attention(spec, p, q_mult=2) + [_norm(p + "attn_q_norm.weight", hd),
                                                      _norm(p + "attn_k_norm.weight", hd),
                                                      _norm(p + "post_attention_norm.weight", E)]
        else:
            t += _gqa_attention(spec, p)
            if spec.arch == "qwen3moe":
                t += [_norm(p + "attn_q_norm.weight", hd), _norm(p + "attn_k_norm.weight", hd),
                      _norm(p + "ffn_norm.weight", E)]
            elif spec.arch == "llama4":
                t.append(_norm(p + "ffn_norm.weight", E))
            else:
                t.append(_norm(p + "post_attention_norm.weight", E))
        t += _experts(spec, p) if i >= spec.n_dense_lead else _dense_ffn(spec, p)
        if i >= spec.n_layer:
            t += _nextn(spec, p)
    return t


def write_metadata(w, spec: SynthSpec, tok: Tokenizer, name: str) -> None:  # w: gguf.GGUFWriter
    import gguf

    a = spec.arch
    w.add_name(name)
    w.add_block_count(spec.n_block)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff if spec.n_dense_lead else spec.n_ff_exp * spec.n_expert_used)
    w.add_head_count(spec.n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(spec.n_expert)
    w.add_expert_used_count(spec.n_expert_used)
    w.add_expert_feed_forward_length(spec.n_ff_exp)
    if a == "deepseek2":
        w.add_head_count_kv(1)
        w.add_key_length(spec.kv_lora + spec.rot)          # the latent KV cache rows
        w.add_value_length(spec.kv_lora)
        w.add_uint32(f"{a}.attention.key_length_mla", spec.qk_nope + spec.rot)
        w.add_uint32(f"{a}.attention.value_length_mla", spec.v_head)
        w.add_uint32(f"{a}.attention.q_lora_rank", spec.q_lora)
        w.add_uint32(f"{a}.attention.kv_lora_rank", spec.kv_lora)
        w.add_rope_dimension_count(spec.rot)
        if spec.expert_groups > 1:
            w.add_uint32(f"{a}.expert_group_count", spec.expert_groups)
            w.add_uint32(f"{a}.expert_group_used_count", spec.group_used)
    else:
        w.add_head_count_kv(spec.n_head_kv)
        w.add_key_length(spec.hd)
        w.add_value_length(spec.hd)
    if a in ("glm4moe", "deepseek2"):
        if a == "glm4moe":
            w.add_rope_dimension_count(spec.hd // 2)     # GLM's partial rotary
        w.add_expert_shared_count(1)
        w.add_leading_dense_block_count(spec.n_dense_lead)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(1.0)
    elif a == "qwen3moe":
        w.add_rope_dimension_count(spec.hd)
    elif a == "llama4":
        w.add_rope_dimension_count(spec.hd)
        w.add_uint32(f"{a}.interleave_moe_layer_step", 1)    # every layer MoE; chunked attention as llama4 has it
    else:  # qwen35moe
        r = spec.rot // 2                                # rotary pairs, spread over three sections
        w.add_rope_dimension_count(spec.rot)
        w.add_array(f"{a}.rope.dimension_sections", [r - 2 * (r // 3), r // 3, r // 3, 0])
        w.add_uint32(f"{a}.expert_shared_feed_forward_length", spec.shexp)
        w.add_uint32(f"{a}.ssm.conv_kernel", spec.ssm_conv)
        w.add_uint32(f"{a}.ssm.state_size", spec.ssm_state)
        w.add_uint32(f"{a}.ssm.group_count", spec.ssm_groups)
        w.add_uint32(f"{a}.ssm.time_step_rank", spec.ssm_v_heads)
        w.add_uint32(f"{a}.ssm.inner_size", spec.ssm_state * spec.ssm_v_heads)
        w.add_uint32(f"{a}.full_attention_interval", spec.full_attn_interval)
    if spec.nextn:
        w.add_uint32(f"{a}.nextn_predict_layers", 1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tok.tokens)
    w.add_token_types(tok.types)
    w.add_token_merges(tok.merges)
    w.add_bos_token_id(tok.bos)
    w.add_eos_token_id(tok.eos)
    w.add_add_bos_token(False)
    w.add_chat_template(spec.chat_template or CHAT_TEMPLATE)
    w.add_string("moeslots.synth.spec", repr(spec))
