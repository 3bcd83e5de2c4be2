"""Shapes of the tiny synthetic models the tests write (importable from any test folder)."""

from moeslots.engine import synth

TINY_GLM = synth.SynthSpec(arch="glm4moe", n_layer=3, n_embd=128, n_head=4, n_head_kv=2, n_expert=16,
                           n_expert_used=4, n_ff_exp=64, n_ff=256, n_vocab=320, nextn=True, dtype="f32", seed=3)
TINY_QWEN = synth.SynthSpec(arch="qwen3moe", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_expert=16,
                            n_expert_used=4, n_ff_exp=64, n_vocab=320, nextn=False, dtype="f16", seed=4)
# K-quant friendly: every row length a multiple of 256
KQ_GLM = synth.SynthSpec(arch="glm4moe", n_layer=2, n_embd=256, n_head=2, n_head_kv=1, n_expert=16,
                         n_expert_used=4, n_ff_exp=256, n_ff=256, n_vocab=320, nextn=True, dtype="f32", seed=5)
