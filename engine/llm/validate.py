"""A GGUF header checked against what llama.cpp and the engine will assume, before llama.cpp sees the file.

llama.cpp stops the process (GGML_ASSERT / GGML_ABORT: exit 134) on some header values instead of refusing the file:
a block count of 0 or over LLAMA_MAX_LAYERS, more NextN blocks than blocks, more experts than LLAMA_MAX_EXPERTS or
more used experts than experts, expert groups that do not divide the experts, an unknown gating function; and while
building the first graph on a negative or NaN norm epsilon, an odd or too large rotary dimension count (0 hangs),
MLA or delta-net head sizes that do not add up, a full-attention interval of 0 (a division by zero). Each such value
is refused here with one line naming the key and the value. The MoE tensors' shapes are checked against the header
too (the engine sizes its expert slabs from them). Values llama.cpp refuses by itself (other tensor shapes, missing
tensors) are left to it: engine.model surfaces its reason. docs/reliability.md lists what a user sees for each.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

from .ggufhead import Header, TensorInfo

# llama.cpp's limits (vendor/llama.cpp/src/llama-hparams.h, patch series of engine/patches)
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024
GATING_FUNCS = {0: "none (arch default)", 1: "softmax", 2: "sigmoid", 3: "softmax_weight", 4: "sqrt_softplus"}
DELTA_NET_ARCHS = {"qwen3next", "qwen35moe"}      # head_v_dim = ssm.inner_size / ssm.time_step_rank
# architectures that rotate every head (a rotary count of 0 hangs their graph); some others are "nope only" (0 rotary
# dimensions, e.g. glm5next) and keep 0
ROPE_ARCHS = {"glm4moe", "qwen3moe", "qwen35moe", "qwen3next", "deepseek2"}
MROPE_ARCHS = {"qwen35moe"}                        # rotate by rope.dimension_sections (all 0: a division by zero)
_EXPS = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.weight$")
_GATE_INP = re.compile(r"^blk\.(\d+)\.ffn_gate_inp\.weight$")


def _int(h: Header, key: str) -> int | None:
    """An integer key's value; None when absent or not a number (an array, a string: llama.cpp checks types)."""
    v = h.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v


def problems(h: Header, tensors: Iterable[TensorInfo] | None = None) -> list[str]:
    """What is wrong with a MoE GGUF's header, one sentence each (empty: nothing found). `tensors`: every shard's
    tensor infos (default: the header's own)."""
    arch = str(h.get("general.architecture", ""))
    a = f"{arch}."
    out: list[str] = []

    def val(key: str) -> Any:
        return h.get(a + key)

    n_block = _int(h, a + "block_count")
    if n_block is None:
        return [f"no {a}block_count (not a {arch or 'known'} model header)"]
    if not 0 < n_block <= LLAMA_MAX_LAYERS:
        out.append(f"{a}block_count = {n_block}: llama.cpp takes 1 to {LLAMA_MAX_LAYERS} blocks")
    n_nextn = _int(h, a + "nextn_predict_layers") or 0
    if n_nextn >= max(n_block, 1):
        out.append(f"{a}nextn_predict_layers = {n_nextn} but {a}block_count = {n_block}: the NextN (MTP) blocks "
                   "are counted in the blocks and leave none for the model")
    n_dense = _int(h, a + "leading_dense_block_count") or 0
    if 0 < n_block - n_nextn <= n_dense:
        out.append(f"{a}leading_dense_block_count = {n_dense} of {n_block - n_nextn} layers: no layer has experts")
    n_expert = _int(h, a + "expert_count") or 0
    k = _int(h, a + "expert_used_count") or 0
    if n_expert > LLAMA_MAX_EXPERTS:
        out.append(f"{a}expert_count = {n_expert}: llama.cpp takes at most {LLAMA_MAX_EXPERTS} experts per layer")
    if k > n_expert > 0:
        out.append(f"{a}expert_used_count = {k} is more than {a}expert_count = {n_expert}")
    out += _groups(h, a, n_expert)
    gating = _int(h, a + "expert_gating_func")
    if gating is not None and gating not in GATING_FUNCS:
        out.append(f"{a}expert_gating_func = {gating}: llama.cpp knows {', '.join(map(str, GATING_FUNCS))}")
    for key, v in h.meta.items():
        if key.startswith(a) and "epsilon" in key and isinstance(v, float) and not (math.isfinite(v) and v >= 0):
            out.append(f"{key} = {v:g}: a norm epsilon must be a finite number >= 0")
    interval = _int(h, a + "full_attention_interval")
    if interval is not None and interval <= 0:
        out.append(f"{a}full_attention_interval = {interval}: must be at least 1")
    out += _heads(h, a, arch)
    out += _tensor_shapes(h, a, n_expert, h.tensors if tensors is None else tensors)
    return out


def _groups(h: Header, a: str, n_expert: int) -> list[str]:
    groups = _int(h, a + "expert_group_count") or 0
    used = _int(h, a + "expert_group_used_count") or 0
    if groups <= 0 or n_expert <= 0:
        return []
    if groups >= n_expert:
        return [f"{a}expert_group_count = {groups}: must be fewer than the {n_expert} experts"]
    if groups > 1 and n_expert % groups:
        return [f"{a}expert_group_count = {groups} does not divide {a}expert_count = {n_expert}"]
    if groups > 1 and not 0 < used < groups:
        return [f"{a}expert_group_used_count = {used}: must be 1 to {groups - 1} of the {groups} expert groups"]
    return []


def _heads(h: Header, a: str, arch: str) -> list[str]:
    """Head sizes that only meet in the graph (rotary dims, MLA, delta-net): llama.cpp aborts building it."""
    out: list[str] = []
    n_embd, n_head = _int(h, a + "embedding_length"), _int(h, a + "attention.head_count")
    klen = _int(h, a + "attention.key_length")
    head_k = klen or (n_embd // n_head if n_embd and n_head else None)
    k_mla, v_mla = _int(h, a + "attention.key_length_mla") or 0, _int(h, a + "attention.value_length_mla") or 0
    rot = _int(h, a + "rope.dimension_count")
    if rot is not None:
        if rot < 0 or rot % 2 or (rot == 0 and arch in ROPE_ARCHS):
            out.append(f"{a}rope.dimension_count = {rot}: rotary dimensions come in pairs (an even number >= 2)")
        elif head_k and rot > head_k:
            out.append(f"{a}rope.dimension_count = {rot} is more than the head size {head_k}")
        elif arch == "deepseek2" and rot >= (k_mla or head_k or rot + 1):
            out.append(f"{a}rope.dimension_count = {rot} leaves no non-rotary head dimensions "
                       f"(key length {k_mla or head_k})")
    sections = h.arrays.get(a + "rope.dimension_sections")
    if sections is not None:                              # multi-section rotary (M-RoPE): sections of the head
        total = sum(sections)
        if any(x < 0 for x in sections) or (head_k and total > head_k) or \
                (arch in MROPE_ARCHS and sum(sections[:3]) <= 0):
            out.append(f"{a}rope.dimension_sections = {list(sections)}: each >= 0, the first three not all 0, "
                       f"together at most the head size {head_k}")
    if arch == "deepseek2" and k_mla and v_mla:          # MLA: one latent KV head of kv_lora_rank + rotary dims
        lora, kv_heads = _int(h, a + "attention.kv_lora_rank"), _int(h, a + "attention.head_count_kv")
        vlen = _int(h, a + "attention.value_length")
        if kv_heads is not None and kv_heads != 1:
            out.append(f"{a}attention.head_count_kv = {kv_heads}: an MLA model has one latent KV head")
        if lora and rot and klen is not None and klen != lora + rot:
            out.append(f"{a}attention.key_length = {klen}: MLA wants kv_lora_rank + rotary dims = {lora + rot}")
        if lora and vlen is not None and vlen != lora:
            out.append(f"{a}attention.value_length = {vlen}: MLA wants kv_lora_rank = {lora}")
    if arch in DELTA_NET_ARCHS:
        inner, state, rank = (_int(h, a + f"ssm.{x}") for x in ("inner_size", "state_size", "time_step_rank"))
        if inner is not None and state and rank and inner != state * rank:
            out.append(f"{a}ssm.inner_size = {inner}: the delta-net layers want state_size x time_step_rank = "
                       f"{state * rank}")
    return out


def _tensor_shapes(h: Header, a: str, n_expert: int, tensors: Iterable[TensorInfo]) -> list[str]:
    """The router and expert tensors against expert_count and embedding_length (the engine's slabs assume them)."""
    out: list[str] = []
    n_embd = _int(h, a + "embedding_length")
    for t in tensors:
        if t.name == "token_embd.weight" and n_embd is not None and t.shape and t.shape[0] != n_embd:
            out.append(f"{a}embedding_length = {n_embd} but token_embd.weight has rows of {t.shape[0]}")
        elif _GATE_INP.match(t.name) and n_expert > 0 and n_embd is not None and tuple(t.shape) != (n_embd, n_expert):
            out.append(f"{t.name} has shape {list(t.shape)}; the header says [{n_embd}, {n_expert}] "
                       f"(embedding_length, expert_count)")
        elif _EXPS.match(t.name) and n_expert > 0 and (len(t.shape) != 3 or t.shape[2] != n_expert):
            out.append(f"{t.name} has shape {list(t.shape)}; the header says {n_expert} experts (its last "
                       "dimension)")
        if len(out) >= 3:
            break
    return out


def first_problem(h: Header, tensors: Iterable[TensorInfo] | None = None) -> str | None:
    ps = problems(h, tensors)
    return ps[0] if ps else None
