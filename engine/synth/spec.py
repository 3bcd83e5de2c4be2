"""What a synthetic model looks like: one frozen spec for the four architectures the project writes.

- glm4moe: first layer dense, sigmoid router, shared expert, optional NextN (MTP) block.
- qwen3moe: plain softmax top-k MoE on every layer, no shared expert.
- qwen35moe (Qwen3.5/3.6-35B-A3B): hybrid layers — gated delta-net (recurrent) layers with a full-attention layer
  every `full_attn_interval`, gated Q, multi-section RoPE; softmax top-k MoE plus a shared expert with its own
  sigmoid gate on every layer; optional NextN block (full attention + MoE).
- deepseek2 (GLM-4.7-Flash): MLA attention (low-rank Q and KV, absorbed K/V up-projections), leading dense layer,
  shared experts, sigmoid gating with a selection bias (`exp_probs_b`), optional expert groups, optional NextN.
- llama4: MoE with a shared expert on every layer, the router's weight applied to the experts' input (so the expert
  cache refuses it: the test of that refusal uses this file); chunked attention on 3 layers of 4, as llama4 has.
"""

from __future__ import annotations

import dataclasses

ARCHS = ("glm4moe", "qwen3moe", "qwen35moe", "deepseek2", "llama4")
NEXTN_ARCHS = ("glm4moe", "qwen35moe", "deepseek2")


@dataclasses.dataclass(frozen=True)
class SynthSpec:
    arch: str = "glm4moe"          # one of ARCHS
    n_layer: int = 4               # trunk layers (the NextN block comes on top)
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2             # deepseek2 (MLA) ignores it: one latent KV head
    head_dim: int | None = None    # default n_embd // n_head
    n_expert: int = 32
    n_expert_used: int = 4
    n_ff_exp: int = 256
    n_ff: int = 512                # dense FFN (glm4moe/deepseek2 leading layer)
    n_vocab: int = 512
    n_ctx: int = 4096
    nextn: bool = True             # a NextN (MTP) block at blk.<n_layer> (NEXTN_ARCHS only)
    nextn_tensors: bool = True     # False: declare the NextN block but write none of its tensors (a broken file)
    const_head: bool = False       # zero output norms: all logits 0, every head agrees (MTP always accepts)
    dtype: str = "f16"             # "f32" | "f16" for non-quantized matrices
    seed: int = 0
    chat_template: str | None = None   # None: the project's simple template (tokenizer.CHAT_TEMPLATE)
    branch_scale: float | None = None  # std factor of every residual branch output; None: auto (see below)
    merged_gate_up: bool = False   # experts as one ffn_gate_up_exps tensor instead of gate + up
    # qwen35moe: gated delta-net layers
    full_attn_interval: int = 4    # every N-th layer is full attention (the real models: 4)
    ssm_state: int = 32            # head dim of the linear-attention K/V heads
    ssm_groups: int = 2            # K heads
    ssm_v_heads: int = 4           # V heads (a multiple of the K heads)
    ssm_conv: int = 4              # causal conv kernel
    ssm_dt_bias: float = 0.0       # time-step bias: ~-4 keeps the delta-net's state for tens of tokens (tests that
                                   # must see a wrong recurrent state in the logits), 0 forgets within a few
    rope_dim: int | None = None    # rotary dims per head (qwen35moe default head_dim // 4; deepseek2 default 32)
    n_ff_shexp: int | None = None  # shared expert width (qwen35moe; default n_ff_exp)
    # deepseek2: MLA and expert groups
    q_lora: int = 64
    kv_lora: int = 64
    qk_nope: int = 32              # per head, K/Q dims without rotary
    v_head: int = 64
    expert_groups: int = 0         # > 1: experts in groups, top `group_used` groups per token
    group_used: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r} (one of {', '.join(ARCHS)})")
        if self.nextn and self.arch not in NEXTN_ARCHS:
            raise ValueError(f"{self.arch} synthetic models carry no NextN block")
        if self.n_embd % self.n_head:
            raise ValueError("n_embd must be divisible by n_head")
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ValueError("need 0 < experts used <= experts")
        if self.dtype not in ("f32", "f16"):
            raise ValueError("dtype must be f32 or f16")
        if self.n_layer < self.n_dense_lead + 1:
            raise ValueError(f"{self.arch} needs at least {self.n_dense_lead + 1} trunk layers (the first is dense)")
        if self.arch == "qwen35moe":
            if self.full_attn_interval < 1:
                raise ValueError("full attention interval must be >= 1")
            if self.ssm_v_heads % self.ssm_groups:
                raise ValueError("linear-attention V heads must be a multiple of its K heads")
            if self.rot % 4 or self.rot > self.hd:
                raise ValueError("rotary dims must be a multiple of 4 and at most the head dim")
        if self.arch == "deepseek2":
            if self.rot % 2 or self.qk_nope < 1:
                raise ValueError("MLA needs even rotary dims and qk_nope >= 1")
            if self.expert_groups > 1 and (
                    self.n_expert % self.expert_groups or not 0 < self.group_used < self.expert_groups
                    or self.group_used * (self.n_expert // self.expert_groups) < self.n_expert_used):
                raise ValueError("expert groups: experts divisible by groups, 0 < groups used < groups, and the "
                                 "used groups must hold the experts used")

    @property
    def hd(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    @property
    def rot(self) -> int:
        if self.rope_dim is not None:
            return self.rope_dim
        return self.hd // 4 if self.arch == "qwen35moe" else 32

    @property
    def shexp(self) -> int:
        return self.n_ff_shexp or self.n_ff_exp

    @property
    def branch(self) -> float:
        """Deep random nets drift: attention averages over positions, and each layer adds that shared part to
        every token's residual stream, until deep layers see nearly the same normalised hidden state for every
        token and route degenerately (48 layers: 63 of 128 experts, top 10 % = 72 % of picks). Scaling every
        branch output keeps the token embedding dominant in the stream."""
        return self.branch_scale if self.branch_scale is not None else min(1.0, 2.0 / self.n_block)

    @property
    def n_dense_lead(self) -> int:
        return 1 if self.arch in ("glm4moe", "deepseek2") else 0

    @property
    def n_block(self) -> int:
        return self.n_layer + (1 if self.nextn else 0)

    def is_recurrent(self, il: int) -> bool:
        """qwen35moe: a gated delta-net layer (the NextN block is always full attention)."""
        return self.arch == "qwen35moe" and il < self.n_layer and (il + 1) % self.full_attn_interval != 0

    def moe_layers(self) -> list[int]:
        return [i for i in range(self.n_block) if i >= self.n_dense_lead]


@dataclasses.dataclass(frozen=True)
class TensorPlan:
    name: str
    ne: tuple[int, ...]      # ggml order (ne0 first)
    kind: str                # "norm" | "zero" | "matrix" | "router" | "embed" | "bias" | "decay" | "conv" | "fill"
    std: float = 0.0         # the std of random kinds; the value of "fill"

    @property
    def n(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n
