"""Synthetic MoE GGUFs for tests and benchmarks: glm4moe, qwen3moe, qwen35moe and deepseek2 (spec.py says what each
carries), with or without a NextN (MTP) block.

Weights are random but chosen so routing is realistic, not degenerate (which would make any cache look perfect): every
matrix is zero-mean (directly written Q4_K blocks are symmetric around zero by construction), the router is a
zero-mean Gaussian scaled so its logits are ~N(0, 1) on the normalised hidden state, and token embeddings are
independent, so router logits vary from token to token. `routing_check()` measures this through the engine.
"""

from .archs import tensor_plan
from .check import RoutingCheck, routing_check, summarize_routing
from .spec import ARCHS, NEXTN_ARCHS, SynthSpec, TensorPlan
from .tokenizer import CHAT_TEMPLATE, CONTROL_TOKENS, Tokenizer, build_tokenizer, bytes_to_unicode
from .writer import Q4_K_BLOCK_BYTES, QK_K, SynthInfo, q4_k_random_blocks, quantize, tensor_values, write_model

__all__ = ["ARCHS", "CHAT_TEMPLATE", "CONTROL_TOKENS", "NEXTN_ARCHS", "Q4_K_BLOCK_BYTES", "QK_K", "RoutingCheck",
           "SynthInfo", "SynthSpec", "TensorPlan", "Tokenizer", "build_tokenizer", "bytes_to_unicode",
           "q4_k_random_blocks", "quantize", "routing_check", "summarize_routing", "tensor_plan", "tensor_values",
           "write_model"]
