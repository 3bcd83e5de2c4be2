"""The `moeslots` command line. Heavy modules are imported inside the commands, so `moeslots engine build` works
before the engine exists, and every user error is one line on stderr with exit code 2 (never a traceback)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence


class UserError(Exception):
    """An error caused by input or environment: printed as one line, exit code 2."""


def _err(msg: str) -> None:
    print(f"moeslots: error: {msg}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------------------
# engine build


def cmd_engine_build(a: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from moeslots.engine import build

    console = Console(stderr=True)
    if a.export_source:
        dest = Path(a.export_source)
        with console.status(f"exporting patched, trimmed source to {dest}"):
            root, size = build.export_source(dest, log=lambda m: console.print(f"[dim]{m}[/]"))
        console.print(f"wrote {root} ({size / 2**20:.1f} MiB, patches {build.patches_hash(build.patch_files())})")
        console.print("build it there with: moeslots engine build --cuda --from-source "
                      f"{root}  (or: python -m moeslots engine build ...)")
        return 0
    flags = build.BuildFlags(cuda=a.cuda, cuda_arch=a.cuda_arch, native=not a.portable, mtmd=a.mtmd)
    progress = Progress(TextColumn("[bold]compiling[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("[dim]{task.description}[/]"), console=console, transient=True)
    task = None

    def on_progress(n: int, total: int, line: str) -> None:
        nonlocal task
        if task is None:
            progress.start()
            task = progress.add_task("", total=total)
        progress.update(task, completed=n, total=total, description=line[-50:])

    try:
        res = build.ensure_engine(flags, force=a.force, from_source=Path(a.from_source) if a.from_source else None,
                                  log=lambda m: console.print(f"[dim]{m}[/]"), progress=on_progress)
    finally:
        if task is not None:
            progress.stop()
    what = {"up-to-date": "engine up to date", "installed-cached": "installed cached engine",
            "built": "built and installed engine"}[res.action]
    console.print(f"{what} ({flags.describe()}, key {res.key}) in {res.seconds:.1f} s")
    return 0


# ---------------------------------------------------------------------------------------------------------------
# doctor


def cmd_doctor(a: argparse.Namespace) -> int:
    from moeslots.engine import native

    rep = native.doctor_report()
    for k, v in rep.lines():
        print(f"{k:<16} {v}")
    return 0 if rep.patched and rep.up_to_date else 1


# ---------------------------------------------------------------------------------------------------------------
# synth


def cmd_synth(a: argparse.Namespace) -> int:
    from moeslots.engine import synth

    spec = synth.SynthSpec(
        arch=a.arch, n_layer=a.layers, n_embd=a.n_embd, n_head=a.heads, n_head_kv=a.kv_heads, head_dim=a.head_dim,
        n_expert=a.experts, n_expert_used=a.experts_used, n_ff_exp=a.expert_ff, n_ff=a.ff, n_vocab=a.vocab,
        nextn=not a.no_nextn if a.arch == "glm4moe" else False, const_head=a.const_head, dtype=a.dtype,
        seed=a.seed, n_ctx=a.ctx,
    )
    out = Path(a.output)
    from rich.console import Console

    console = Console(stderr=True)
    info = synth.write_model(spec, out, quant=a.quant, progress=_rich_bytes_progress(console, "writing"),
                             log=lambda m: console.print(f"[dim]{m}[/]"))
    console.print(f"wrote {out} ({info.file_bytes / 2**20:.1f} MiB, {info.n_params / 1e6:.1f} M params, "
                  f"{info.seconds:.1f} s)")
    if not a.no_check:
        rc = synth.routing_check(out, n_tokens=a.check_tokens, threads=a.threads)
        print(rc.render())
        if rc.degenerate:
            _err("routing looks degenerate (see above): this model would make any cache look perfect")
            return 1
    return 0


def _rich_bytes_progress(console, label: str) -> Callable[[int, int], None]:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    prog = Progress(TextColumn(f"[bold]{label}[/]"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                    console=console, transient=True)
    state: dict = {}

    def cb(done: int, total: int) -> None:
        if "task" not in state:
            prog.start()
            state["task"] = prog.add_task(label, total=total)
        prog.update(state["task"], completed=done, total=total)
        if done >= total:
            prog.stop()

    return cb


# ---------------------------------------------------------------------------------------------------------------
# generate


def cmd_generate(a: argparse.Namespace) -> int:
    from moeslots.engine import generate, native

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


def cmd_bench(a: argparse.Namespace) -> int:
    from moeslots.engine import bench, native

    native.require_patched()
    try:
        slots = [int(x) for x in a.slots.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--slots takes comma-separated numbers, got {a.slots!r}") from None
    rows, info = bench.run(Path(a.model), slots, n_decode=a.n_decode, prompt_len=a.prompt_len, threads=a.threads,
                           mmap=not a.no_mmap, pack_host=a.pack_host, greedy_prompts=a.greedy_prompts,
                           greedy_tokens=a.greedy_tokens, with_stats=not a.no_stats, replay_from=a.replay,
                           log=lambda m: print(m, file=sys.stderr))
    print(bench.render(rows, info))
    if a.json:
        bench.save(rows, info, Path(a.json))
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    """Until the TUI lands: write the default synthetic model on first use and stream greedy text from it."""
    from moeslots.engine import native, synth

    native.require_patched()
    path = synth.default_demo_model()
    ns = argparse.Namespace(model=str(path), prompt=a.prompt, n_predict=a.n_predict, ctx=1024, threads=None,
                            experts_on_gpu=False, gpu_layers=-1, quiet=False)
    print(f"[moeslots demo: greedy text from the synthetic model {path}; the chat app arrives with the TUI]",
          file=sys.stderr)
    return cmd_generate(ns)


# ---------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moeslots", description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--version", action="version", version="moeslots 0.1.0")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    e = sub.add_parser("engine", help="build and install the patched llama-cpp-python engine")
    esub = e.add_subparsers(dest="engine_cmd", metavar="ACTION", required=True)
    b = esub.add_parser("build", help="download sdist, apply engine/patches, build (cached), install")
    b.add_argument("--cuda", action="store_true", help="build the CUDA backend")
    b.add_argument("--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES number (default: from the GPU, else 90)")
    b.add_argument("--portable", action="store_true", help="no -march=native (for a wheel used on other CPUs)")
    b.add_argument("--mtmd", action="store_true", help="also build llama-cpp-python's multimodal library")
    b.add_argument("--force", action="store_true", help="rebuild even if a cached wheel matches")
    b.add_argument("--export-source", metavar="DIR", help="write the patched, trimmed source tree and stop")
    b.add_argument("--from-source", metavar="DIR", help="build from a tree written by --export-source (offline)")
    b.set_defaults(func=cmd_engine_build)

    d = sub.add_parser("doctor", help="engine version, patched or not, GPUs and VRAM, CPU threads")
    d.set_defaults(func=cmd_doctor)

    s = sub.add_parser("synth", help="write a synthetic MoE GGUF (tests, benchmarks) and check its routing")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--arch", choices=["glm4moe", "qwen3moe"], default="glm4moe")
    s.add_argument("--layers", type=int, default=4, help="trunk layers (glm4moe: the first is dense)")
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
    s.add_argument("--no-nextn", action="store_true", help="glm4moe without the NextN (MTP) block")
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

    bn = sub.add_parser("bench", help="decode/prompt speed, hit rate and uploads at several slot counts")
    bn.add_argument("model")
    bn.add_argument("--slots", default="0,16,32,64,96,128", help="comma-separated slots per layer")
    bn.add_argument("-n", "--n-decode", type=int, default=128)
    bn.add_argument("--prompt-len", type=int, default=512)
    bn.add_argument("--threads", type=int, default=None)
    bn.add_argument("--no-mmap", action="store_true", help="load experts into (pinned) host memory, not mmap")
    bn.add_argument("--pack-host", action="store_true", help="hot packs in host memory (CPU-only testing)")
    bn.add_argument("--greedy-prompts", type=int, default=4)
    bn.add_argument("--greedy-tokens", type=int, default=256)
    bn.add_argument("--no-stats", action="store_true", help="native routing stats off (to measure their cost)")
    bn.add_argument("--replay", metavar="TRACE|uniform",
                    help="route through a recorded trace (CSV) or uniform random ids instead of the router")
    bn.add_argument("--json", help="also write the rows as JSON")
    bn.set_defaults(func=cmd_bench)

    m = sub.add_parser("demo", help="(default) greedy text from the bundled synthetic model")
    m.add_argument("-p", "--prompt", default="The expert cache")
    m.add_argument("-n", "--n-predict", type=int, default=48)
    m.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from moeslots.engine.build import BuildError
    from moeslots.engine.errors import EngineError

    parser = build_parser()
    a = parser.parse_args(argv)
    if a.cmd is None:
        a = parser.parse_args(["demo", *(argv or [])])
    try:
        return a.func(a)
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except UserError as e:
        _err(str(e))
        return 2
    except (EngineError, BuildError) as e:
        _err(str(e))
        return 2
