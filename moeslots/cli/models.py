"""`moeslots synth`, `generate`, `demo` and `models`: model files written, run without the app, and found."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import UserError, config, err, rich_bytes_progress


def cmd_synth(a: argparse.Namespace) -> int:
    from ..engine import synth

    try:
        spec = synth.SynthSpec(
            arch=a.arch, n_layer=a.layers, n_embd=a.n_embd, n_head=a.heads, n_head_kv=a.kv_heads,
            head_dim=a.head_dim, n_expert=a.experts, n_expert_used=a.experts_used, n_ff_exp=a.expert_ff, n_ff=a.ff,
            n_vocab=a.vocab, nextn=not a.no_nextn and a.arch in synth.NEXTN_ARCHS, const_head=a.const_head,
            dtype=a.dtype, seed=a.seed, n_ctx=a.ctx, merged_gate_up=a.merged_gate_up,
            full_attn_interval=a.full_attn_interval, ssm_state=a.ssm_state, ssm_groups=a.ssm_groups,
            ssm_v_heads=a.ssm_v_heads, rope_dim=a.rope_dim, n_ff_shexp=a.shexp_ff, q_lora=a.q_lora,
            kv_lora=a.kv_lora, qk_nope=a.qk_nope, v_head=a.v_head, expert_groups=a.expert_groups,
            group_used=a.group_used)
    except ValueError as e:
        raise UserError(f"synth: {e}") from None
    out = Path(a.output)
    from rich.console import Console

    console = Console(stderr=True)
    info = synth.write_model(spec, out, quant=a.quant, progress=rich_bytes_progress(console, "writing"),
                             log=lambda m: console.print(f"[dim]{m}[/]"))
    console.print(f"wrote {out} ({info.file_bytes / 2**20:.1f} MiB, {info.n_params / 1e6:.1f} M params, "
                  f"{info.seconds:.1f} s)")
    if not a.no_check:
        rc = synth.routing_check(out, n_tokens=a.check_tokens, threads=a.threads)
        print(rc.render())
        if rc.degenerate:
            err("routing looks degenerate (see above): this model would make any cache look perfect")
            return 1
    return 0


def cmd_generate(a: argparse.Namespace) -> int:
    from ..engine.llm import generate
    from ..engine.native import lib as native

    native.require_patched()
    model = generate.open_model(Path(a.model), n_ctx=a.ctx, threads=a.threads, experts_on_host=not a.experts_on_gpu,
                                n_gpu_layers=a.gpu_layers)
    try:
        out = sys.stdout
        stats = None
        for piece in generate.greedy_stream(model, a.prompt, a.n_predict):
            if isinstance(piece, str):
                out.write(piece)
                out.flush()
            else:
                stats = piece
        out.write("\n")
        if stats is not None and not a.quiet:
            print(stats.render(), file=sys.stderr)
    finally:
        model.close()
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    """Greedy text from the bundled model, without the app."""
    from ..engine.errors import EngineError
    from ..engine.machine import bundled
    from ..engine.native import lib as native

    native.require_patched()
    try:
        path = bundled.model()
    except EngineError as e:
        raise UserError(str(e)) from None
    ns = argparse.Namespace(model=str(path), prompt=a.prompt, n_predict=a.n_predict, ctx=1024, threads=None,
                            experts_on_gpu=False, gpu_layers=-1, quiet=False)
    print(f"[moeslots demo: greedy text from the bundled model {path.name}]", file=sys.stderr)
    return cmd_generate(ns)


def cmd_models(a: argparse.Namespace) -> int:
    from ..engine.machine import discovery

    for d in a.dirs:
        if not Path(d).expanduser().is_dir():
            raise UserError(f"not a folder: {d}")
    s = discovery.survey(list(config().get("app", {}).get("model_dirs", [])) + list(a.dirs))
    print("\n".join(discovery.table(s)))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("synth", help="write a synthetic MoE GGUF (tests, benchmarks) and check its routing")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--arch", choices=["glm4moe", "qwen3moe", "qwen35moe", "deepseek2"], default="glm4moe",
                   help="glm4moe (GLM-4.5 style); qwen3moe (Qwen3-30B-A3B); qwen35moe (Qwen3.5/3.6-35B-A3B: gated "
                   "delta-net + full attention, shared expert); deepseek2 (GLM-4.7-Flash: MLA, shared expert, "
                   "biased sigmoid gating)")
    s.add_argument("--layers", type=int, default=4, help="trunk layers (glm4moe, deepseek2: the first is dense)")
    s.add_argument("--n-embd", type=int, default=256)
    s.add_argument("--heads", type=int, default=4)
    s.add_argument("--kv-heads", type=int, default=2)
    s.add_argument("--head-dim", type=int, default=None, help="default: n_embd / heads")
    s.add_argument("--experts", type=int, default=32)
    s.add_argument("--experts-used", type=int, default=4)
    s.add_argument("--expert-ff", type=int, default=256)
    s.add_argument("--ff", type=int, default=512, help="dense FFN width (glm4moe leading dense layer)")
    s.add_argument("--vocab", type=int, default=512)
    s.add_argument("--ctx", type=int, default=4096)
    s.add_argument("--dtype", choices=["f32", "f16"], default="f16")
    s.add_argument("--quant", choices=["none", "q8_0", "q4_k_m", "q4_k"], default="none",
                   help="q8_0/q4_k_m: quantize through the engine; q4_k: write Q4_K blocks directly (big shapes)")
    s.add_argument("--no-nextn", action="store_true", help="no NextN (MTP) block (glm4moe, qwen35moe, deepseek2)")
    s.add_argument("--merged-gate-up", action="store_true", help="experts as one ffn_gate_up_exps tensor")
    s.add_argument("--shexp-ff", type=int, default=None, help="qwen35moe: shared expert width (default --expert-ff)")
    s.add_argument("--rope-dim", type=int, default=None,
                   help="rotary dims per head (qwen35moe: head dim / 4; deepseek2: 32)")
    s.add_argument("--full-attn-interval", type=int, default=4, help="qwen35moe: every N-th layer full attention")
    s.add_argument("--ssm-state", type=int, default=32, help="qwen35moe: linear-attention head dim")
    s.add_argument("--ssm-groups", type=int, default=2, help="qwen35moe: linear-attention K heads")
    s.add_argument("--ssm-v-heads", type=int, default=4, help="qwen35moe: linear-attention V heads")
    s.add_argument("--q-lora", type=int, default=64, help="deepseek2: Q low-rank dim")
    s.add_argument("--kv-lora", type=int, default=64, help="deepseek2: KV latent dim")
    s.add_argument("--qk-nope", type=int, default=32, help="deepseek2: per-head Q/K dims without rotary")
    s.add_argument("--v-head", type=int, default=64, help="deepseek2: per-head V dim")
    s.add_argument("--expert-groups", type=int, default=0, help="deepseek2: expert groups (0: none)")
    s.add_argument("--group-used", type=int, default=0, help="deepseek2: groups each token routes within")
    s.add_argument("--const-head", action="store_true", help="every head agrees (all logits equal): MTP accepts")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--no-check", action="store_true", help="skip the routing check")
    s.add_argument("--check-tokens", type=int, default=256)
    s.add_argument("--threads", type=int, default=None)
    s.set_defaults(func=cmd_synth)

    g = sub.add_parser("generate", help="stream greedy tokens from MODEL through the patched engine")
    g.add_argument("model")
    g.add_argument("-p", "--prompt", default="Once upon a time")
    g.add_argument("-n", "--n-predict", type=int, default=64)
    g.add_argument("--ctx", type=int, default=2048)
    g.add_argument("--threads", type=int, default=None)
    g.add_argument("--gpu-layers", type=int, default=-1, help="layers on the GPU when one exists (-1: all)")
    g.add_argument("--experts-on-gpu", action="store_true",
                   help="do not override expert tensors into host memory (stock full offload)")
    g.add_argument("-q", "--quiet", action="store_true", help="no timing line")
    g.set_defaults(func=cmd_generate)

    mo = sub.add_parser("models", help="the GGUF models found here (Hugging Face cache, LM Studio, [app] model_dirs, "
                        "this folder): size, arch, experts and whether they fit this machine")
    mo.add_argument("dirs", nargs="*", help="more folders to search")
    mo.set_defaults(func=cmd_models)

    m = sub.add_parser("demo", help="greedy text from the bundled model, without the app")
    m.add_argument("-p", "--prompt", default="def parse_args(argv):\n")
    m.add_argument("-n", "--n-predict", type=int, default=64)
    m.set_defaults(func=cmd_demo)
