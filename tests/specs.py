"""Shapes of the tiny synthetic models the tests write (importable from any test folder)."""

from moeslots.engine import synth

TINY_GLM = synth.SynthSpec(arch="glm4moe", n_layer=3, n_embd=128, n_head=4, n_head_kv=2, n_expert=16,
                           n_expert_used=4, n_ff_exp=64, n_ff=256, n_vocab=320, nextn=True, dtype="f32", seed=3)
TINY_QWEN = synth.SynthSpec(arch="qwen3moe", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_expert=16,
                            n_expert_used=4, n_ff_exp=64, n_vocab=320, nextn=False, dtype="f16", seed=4)
# K-quant friendly: every row length a multiple of 256
KQ_GLM = synth.SynthSpec(arch="glm4moe", n_layer=2, n_embd=256, n_head=2, n_head_kv=1, n_expert=16,
                         n_expert_used=4, n_ff_exp=256, n_ff=256, n_vocab=320, nextn=True, dtype="f32", seed=5)
# qwen35moe (Qwen3.6-35B-A3B's architecture): gated delta-net layers with full attention every 4th (layer 3), shared
# expert with its gate, NextN block; one with separate gate/up experts, one with merged gate_up
# (n_head x head_dim != n_embd, as Qwen3.6's 16 x 256 vs 2048; a long-memory delta-net, so a wrong recurrent state
# shows in the logits tokens later)
TINY_Q35 = synth.SynthSpec(arch="qwen35moe", n_layer=4, n_embd=128, n_head=4, n_head_kv=2, head_dim=64, n_expert=16,
                           n_expert_used=4, n_ff_exp=64, n_vocab=320, nextn=True, dtype="f32", seed=7, ssm_state=16,
                           ssm_groups=2, ssm_v_heads=4, ssm_dt_bias=-4.0)
TINY_Q35_MERGED = synth.SynthSpec(**{**TINY_Q35.__dict__, "merged_gate_up": True, "seed": 8})
# deepseek2 (GLM-4.7-Flash's architecture): MLA, leading dense layer, shared expert, sigmoid gating with a selection
# bias, expert groups, NextN block
TINY_DS2 = synth.SynthSpec(arch="deepseek2", n_layer=3, n_embd=128, n_head=4, n_expert=16, n_expert_used=4,
                           n_ff_exp=64, n_ff=256, n_vocab=320, nextn=True, dtype="f32", seed=9, q_lora=64, kv_lora=64,
                           qk_nope=32, v_head=32, rope_dim=16, expert_groups=4, group_used=2)
