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
    """One line, whatever the message carries (a file's strings may hold newlines or terminal escapes)."""
    line = " ".join(msg.split("\n")).translate({c: "\ufffd" for c in (*range(32), 127)})
    print(f"moeslots: error: {line}", file=sys.stderr)


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
        console.print("build it there with: moeslots engine build --from-source "
                      f"{root}  (CUDA when that machine has an NVIDIA GPU and nvcc; --cuda/--cpu force one)")
        return 0
    extra = tuple(a.cmake_arg or ())
    bad = [x for x in extra if not x.startswith("-D")]
    if bad:
        raise UserError(f"--cmake-arg takes -DNAME=VALUE, not {bad[0]!r}")
    flags, why = build.choose_flags(a.backend, cuda_arch=a.cuda_arch, native=not a.portable, mtmd=a.mtmd,
                                    extra=extra)
    console.print(why, soft_wrap=True, markup=False, highlight=False)    # which engine, and why
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
    from moeslots.engine import hardware

    warn = hardware.cpu_engine_warning(hardware.probe_gpus(), any(d.kind in ("GPU", "iGPU") for d in rep.devices))
    if warn:
        print(f"{'warning':<16} {warn}")
    if not (rep.patched and rep.up_to_date):
        return 1
    if a.calibrate:
        from moeslots.engine import calibrate

        print(f"calibrating with {a.calibrate} (uploads, CPU expert rate, per-token base)...", file=sys.stderr)
        try:
            c = calibrate.run(Path(a.calibrate), threads=a.threads, log=lambda m: print(f"  {m}", file=sys.stderr))
        except (OSError, ValueError) as e:
            raise UserError(f"calibration failed: {e}") from None
        print(f"calibration      {c.render()}", flush=True)
        p = calibrate.save(c)
        print(f"saved            {p} [calibration.\"{c.machine}\"]: --repick auto now uses these costs")
    else:
        from moeslots.engine import calibrate

        c = calibrate.load()
        print(f"calibration      {c.render() if c else 'none for this machine (moeslots doctor --calibrate MODEL)'}")
    return 0


# ---------------------------------------------------------------------------------------------------------------
# synth


def cmd_synth(a: argparse.Namespace) -> int:
    from moeslots.engine import synth

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


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} takes comma-separated numbers, got {text!r}") from None


def cmd_bench(a: argparse.Namespace) -> int:
    from moeslots.engine import bench, native

    native.require_patched()
    intervals: list[int] = []
    if a.repick:
        words = [x.strip() for x in a.repick.split(",") if x.strip()]
        if not all(x == "auto" or x.isdigit() for x in words):
            raise UserError(f"--repick takes intervals >= 0 (0: static) or auto, not {a.repick!r}")
        intervals = [bench.AUTO if x == "auto" else int(x) for x in words]
    try:
        slots = [int(x) for x in a.slots.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--slots takes comma-separated numbers, got {a.slots!r}") from None
    if any(n < 0 for n in slots):
        raise UserError(f"--slots takes numbers >= 0 (slots per layer), got {a.slots!r}")
    from moeslots.engine import cache as cache_mod

    cache_mod.set_async(a.async_cpu)
    print(f"host chain overlaps the GPU chain: {'yes (--async-cpu)' if cache_mod.async_enabled() else 'no'}",
          file=sys.stderr)
    if a.mtp:
        drafts = _int_list(a.mtp, "--mtp")
        print("| slots/layer | draft | plain tok/s | MTP tok/s | acceptance | tokens/step | same greedy text | "
              "ms per step: feed / drafts / verify / rest |")
        print("|---|---|---|---|---|---|---|---|")
        try:
            text = Path(a.prompt_file).read_text(encoding="utf-8") if a.prompt_file else None
            mrows = bench.run_mtp(Path(a.model), slots, drafts, n_tokens=a.n_decode, threads=a.threads,
                                  pack_host=a.pack_host, prompt_text=text, mtp_head=a.mtp_head,
                                  replay_from=a.replay, mmap=not a.no_mmap, log=print)
        except ValueError as e:
            raise UserError(str(e)) from None
        if a.json:
            import dataclasses as dc
            import json

            Path(a.json).write_text(json.dumps([dc.asdict(r) for r in mrows], indent=1))
        return 0
    if a.repick:
        from moeslots.engine import calibrate

        cal = calibrate.load()
        cost = None
        if cal is not None:
            from moeslots.engine.model import inspect_gguf

            cost = cal.cost_model(inspect_gguf(Path(a.model)).slab_bytes / 1e6, pinned=a.no_mmap)
        routings = [r for r in (a.replay or "uniform").split(",") if r.strip()]
        print(f"cost model for the simulator: {'calibration of ' + cal.machine if cal else 'defaults (H200 box)'}")
        print(bench.REPICK_HEADER)
        try:
            rrows, rinfo = bench.run_repick(Path(a.model), slots, intervals, routings,
                                            n_decode=a.n_decode, profile_rows=a.profile_rows, threads=a.threads,
                                            mmap=not a.no_mmap, pack_host=a.pack_host, max_swaps=a.max_swaps,
                                            cost=cost, overlap=a.overlap, profile_from=a.profile_from, log=print)
        except ValueError as e:
            raise UserError(str(e)) from None
        for name, src in rinfo["routings"].items():
            print(f"routing {name}: {src}")
        if a.json:
            import dataclasses as dc
            import json

            Path(a.json).write_text(json.dumps({"info": rinfo, "rows": [dc.asdict(r) for r in rrows]}, indent=1))
        return 0
    rows, info = bench.run(Path(a.model), slots, n_decode=a.n_decode, prompt_len=a.prompt_len, threads=a.threads,
                           mmap=not a.no_mmap, pack_host=a.pack_host, greedy_prompts=a.greedy_prompts,
                           greedy_tokens=a.greedy_tokens, with_stats=not a.no_stats, replay_from=a.replay,
                           greedy_slots=_int_list(a.greedy_slots, "--greedy-slots") if a.greedy_slots else None,
                           log=lambda m: print(m, file=sys.stderr))
    print(bench.render(rows, info))
    if a.json:
        bench.save(rows, info, Path(a.json))
    return 0


def cmd_demo(a: argparse.Namespace) -> int:
    """Greedy text from the bundled model, without the app."""
    from moeslots.engine import bundled, native
    from moeslots.engine.errors import EngineError

    native.require_patched()
    try:
        path = bundled.model()
    except EngineError as e:
        raise UserError(str(e)) from None
    ns = argparse.Namespace(model=str(path), prompt=a.prompt, n_predict=a.n_predict, ctx=1024, threads=None,
                            experts_on_gpu=False, gpu_layers=-1, quiet=False)
    print(f"[moeslots demo: greedy text from the bundled model {path.name}]", file=sys.stderr)
    return cmd_generate(ns)


def _parse_repick(v: str | None) -> tuple[int, int]:
    if not v or v == "auto":
        return 0, 4
    n, _, m = v.partition(":")
    try:
        return int(n), int(m) if m else 4
    except ValueError:
        raise UserError(f"--repick takes N or N:M (every N tokens, at most M swaps per layer), not {v!r}") from None


def _open_engine(model: Path, profile: Path | None, slots: str | None, mtp: bool, threads: int | None,
                 ctx: int, repick: str | None = None, async_cpu: bool = False, mmap: bool | str = "auto",
                 auto_profile: bool = False) -> "object":
    from moeslots.engine import native
    from moeslots.engine.engine import AUTO_EVERY, Engine, EngineConfig

    native.require_patched()
    pack_host = not native.gpus()
    if slots is None:       # a profile, or a GPU to plan from the first prompt (auto profile): as many as fit
        slots = "auto" if profile or (auto_profile and not pack_host) else "0"
    n_or_auto: int | str = slots if slots == "auto" else _int_arg("--slots", slots)
    every, swaps = _parse_repick(repick)
    from moeslots.engine.threads import app_threads

    threads = threads or app_threads()         # the app keeps a physical core for its UI (engine/threads.py)
    eng = Engine(EngineConfig(model=model, n_ctx=ctx, slots=n_or_auto, profile=profile, mtp=mtp, threads=threads,
                              pack_host=pack_host, repick_every=every, repick_swaps=swaps, async_cpu=async_cpu,
                              mmap=mmap, repick_auto_every=AUTO_EVERY if repick == "auto" else 0,
                              auto_profile=auto_profile))
    if pack_host and n_or_auto not in (0, "0"):
        eng.notices.append("no GPU: the slots live in host memory (shows the cache at work; no speed-up)")
    if repick == "auto":
        try:
            eng.notices.append(eng.set_repick_auto())  # type: ignore[attr-defined]
        except BaseException:
            eng.close()  # type: ignore[attr-defined]
            raise
    return eng


def _int_arg(flag: str, v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise UserError(f"{flag} takes a number or 'auto', not {v!r}") from None


def _config() -> dict:
    from moeslots.tui import config

    try:
        return config.load()
    except config.ConfigError as e:
        raise UserError(str(e)) from None


def _run_app(eng: "object", model_name: str, remember: bool = True, a: argparse.Namespace | None = None,
             model: Path | None = None) -> int:
    from moeslots.tui.app import MoeslotsApp

    keymap = dict(_config().get("keymap", {}))
    from moeslots.engine import native

    native.set_log_echo(False)            # the app draws on the terminal: engine errors reach it as notifications
    app = MoeslotsApp(eng, model_name=model_name, keymap=keymap, remember=remember)  # type: ignore[arg-type]
    app.model_path, app.model_dirs = model, list(_config().get("app", {}).get("model_dirs", []))
    app.opener = lambda p: _chat_engine(p, a or build_parser().parse_args(["chat", str(p)]), explicit=False)
    try:
        app.run()
    finally:
        native.set_log_echo(True)
        app._cancel.set()                 # a reply still running in its worker thread stops at the next token
        app.engine.close()  # type: ignore[attr-defined]   (waits for that thread; the model picker may have
    return 0                #                                switched engines)


def _chat_engine(model: Path, a: argparse.Namespace, *, explicit: bool = True) -> "object":
    """The engine for `chat MODEL` (explicit) or a model picked in the app; remembered as [app] last_model."""
    from moeslots import launch

    s = launch.resolve(model, a, _config().get("app", {}), explicit=explicit)
    eng = _open_engine(model, s.profile, s.slots, s.mtp, s.threads, s.ctx, s.repick, s.async_cpu, s.mmap,
                       s.auto_profile)
    err = launch.remember(model)
    if err:
        eng.notices.append(err)  # type: ignore[attr-defined]
    return eng


def cmd_chat(a: argparse.Namespace) -> int:
    model = Path(a.model).expanduser()
    return _run_app(_chat_engine(model, a), model.name, a=a, model=model)


def cmd_models(a: argparse.Namespace) -> int:
    from moeslots.engine import discovery

    for d in a.dirs:
        if not Path(d).expanduser().is_dir():
            raise UserError(f"not a folder: {d}")
    s = discovery.survey(list(_config().get("app", {}).get("model_dirs", [])) + list(a.dirs))
    print("\n".join(discovery.table(s)))
    return 0


def cmd_app(a: argparse.Namespace) -> int:
    """`moeslots` alone: the app on the default model: the bundled trained model (engine/assets) with its merged
    code+chat profile and a quarter of its experts in slots, unless config.toml names another."""
    from moeslots.engine import bundled, native

    native.require_patched()
    from moeslots import launch

    target, gone = launch.start_model(_config().get("app", {}))
    if target is not None:                       # [app] model, else the last model used
        return cmd_chat(build_parser().parse_args(["chat", str(target)]))
    from moeslots.engine.errors import EngineError

    try:
        path, prof = bundled.model(), bundled.profile("merged")
    except EngineError as e:
        raise UserError(str(e)) from None
    from moeslots.engine.model import inspect_gguf

    eng = _open_engine(path, prof, str(inspect_gguf(path).n_expert // 4), True, None, 4096)
    if gone:
        eng.notices.append(gone)  # type: ignore[attr-defined]
    return _run_app(eng, path.name, remember=False, model=path)


# ---------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from moeslots.cli_profiles import cmd_profile_merge, cmd_profile_show, cmd_record, cmd_simulate

    p = argparse.ArgumentParser(prog="moeslots", description="moeslots: a terminal chat for local MoE LLMs that "
                                "keeps a profile-chosen set of experts per layer in VRAM")
    p.add_argument("--version", action="version", version="moeslots 0.1.0")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    e = sub.add_parser("engine", help="build and install the patched llama-cpp-python engine")
    esub = e.add_subparsers(dest="engine_cmd", metavar="ACTION", required=True)
    b = esub.add_parser("build", help="download sdist, apply engine/patches, build (cached), install")
    bk = b.add_mutually_exclusive_group()
    bk.add_argument("--cuda", dest="backend", action="store_const", const="cuda",
                    help="build the CUDA backend (default: when nvidia-smi lists a GPU and nvcc is found)")
    bk.add_argument("--cpu", dest="backend", action="store_const", const="cpu",
                    help="build the CPU backend even where a GPU and the CUDA toolkit are found")
    b.set_defaults(backend="auto")
    b.add_argument("--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES number (default: from the GPU, else 90)")
    b.add_argument("--portable", action="store_true", help="no -march=native (for a wheel used on other CPUs)")
    b.add_argument("--mtmd", action="store_true", help="also build llama-cpp-python's multimodal library")
    b.add_argument("--cmake-arg", action="append", metavar="-DNAME=VALUE",
                   help="extra CMake definition (repeatable), e.g. -DGGML_CUDA_FA=OFF for a faster test build")
    b.add_argument("--force", action="store_true", help="rebuild even if a cached wheel matches")
    b.add_argument("--export-source", metavar="DIR", help="write the patched, trimmed source tree and stop")
    b.add_argument("--from-source", metavar="DIR", help="build from a tree written by --export-source (offline)")
    b.set_defaults(func=cmd_engine_build)

    d = sub.add_parser("doctor", help="engine version, patched or not, GPUs and VRAM, CPU threads; calibration")
    d.add_argument("--calibrate", metavar="MODEL", help="measure this machine's upload (pinned, pageable), CPU "
                   "expert and per-token rates with MODEL and store them in config.toml for --repick auto")
    d.add_argument("--threads", type=int, default=None)
    d.set_defaults(func=cmd_doctor)

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
    bn.add_argument("--greedy-slots", metavar="S1,S2", help="only these slot counts get the greedy-agreement run "
                    "(default: all; 0 is the reference)")
    bn.add_argument("--async-cpu", action=argparse.BooleanOptionalAction, default=False,
                    help="host chain overlapping the GPU chain (patch 0008; off by default: no gain measured on the "
                    "H200 box)")
    bn.add_argument("--no-stats", action="store_true", help="native routing stats off (to measure their cost)")
    bn.add_argument("--replay", metavar="TRACE|uniform",
                    help="route through a recorded trace (CSV) or uniform random ids instead of the router")
    bn.add_argument("--mtp", metavar="D1,D2", help="instead: greedy tok/s with and without MTP at these draft lengths")
    bn.add_argument("--repick", metavar="N1,N2", help="instead: static (0) vs re-pick every N tokens under each "
                    "--replay routing (comma-separated traces and/or 'uniform'), with the simulator's prediction; "
                    "'auto': live --repick auto (chosen from the profile rows, then again every 256 decoded tokens)")
    bn.add_argument("--mtp-head", default="gpu", choices=["slots", "host", "gpu"],
                    help="--mtp: the NextN block's experts on the GPU (default, as the app), in the plan (slots), or "
                    "in host memory")
    bn.add_argument("--prompt-file", help="--mtp: a user turn (chat template) instead of random prompt tokens")
    bn.add_argument("--profile-rows", type=int, default=1024, help="--repick: trace rows that make the static plan")
    bn.add_argument("--profile-from", metavar="TRACE", help="--repick: take those rows from this trace instead of the "
                    "replayed one (a profile that does not match the chat)")
    bn.add_argument("--max-swaps", type=int, default=4, help="--repick: at most M swaps per layer per re-pick")
    bn.add_argument("--overlap", action="store_true", help="--repick: copies staged on a worker thread while "
                    "decoding, committed between steps (as the engine does), instead of synchronous swaps")
    bn.add_argument("--json", help="also write the rows as JSON")
    bn.set_defaults(func=cmd_bench)
    from moeslots import bench_app

    bench_app.add_parser(sub)                  # `moeslots bench app MODEL ...`: the app beside the engine alone

    r = sub.add_parser("record", help="record a routing trace (profile) while the model answers prompt files")
    r.add_argument("model")
    r.add_argument("--prompt-file", action="append", required=True, help="a prompt (one chat turn); repeatable")
    r.add_argument("-n", "--n-predict", type=int, default=500, help="decode tokens per prompt")
    r.add_argument("-o", "--output", required=True)
    r.add_argument("--threads", type=int, default=None)
    r.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sample")
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(func=cmd_record)

    pr = sub.add_parser("profile", help="merge or inspect profiles")
    prs = pr.add_subparsers(dest="profile_cmd", metavar="ACTION", required=True)
    pm = prs.add_parser("merge", help="concatenate traces of one model; prints the overlap of their top sets")
    pm.add_argument("inputs", nargs="+")
    pm.add_argument("-o", "--output", required=True)
    pm.add_argument("--slots", type=int, default=None, help="slots for the overlap (default: a quarter of experts)")
    pm.set_defaults(func=cmd_profile_merge)
    ps = prs.add_parser("show", help="skew, coverage at S slots, heatmap")
    ps.add_argument("profile")
    ps.add_argument("--slots", type=int, default=None)
    ps.add_argument("--against", help="another profile: overlap of the top sets")
    ps.add_argument("--width", type=int, default=64)
    ps.set_defaults(func=cmd_profile_show)

    si = sub.add_parser("simulate", help="replay a trace through residency policies (what-if)")
    si.add_argument("trace")
    si.add_argument("--slots", type=int, required=True)
    si.add_argument("--policy", action="append", help="static-profile, static-oracle, lru, lfu-decay, reelect-K")
    si.add_argument("--train", help="profile the static plan is trained on (default: the trace itself)")
    si.add_argument("--reelect-k", type=int, default=16)
    si.add_argument("--reelect-window", type=int, default=64)
    si.add_argument("--slab-mb", type=float, default=3.06, help="bytes of one expert (gate+up+down), MB")
    si.add_argument("--cpu-gbps", type=float, default=80.0)
    si.add_argument("--pcie-gbps", type=float, default=55.0)
    si.add_argument("--gpu-gbps", type=float, default=4000.0)
    si.add_argument("--base-ms", type=float, default=3.0, help="non-expert time per token")
    si.add_argument("--union", type=int, metavar="W", help="instead: distinct experts on the CPU per layer for "
                    "batches of 1..W tokens (what an MTP verify batch reads)")
    si.set_defaults(func=cmd_simulate)

    c = sub.add_parser("chat", help="the chat app on MODEL with the expert cache")
    c.add_argument("model")
    c.add_argument("--profile", help="profile (trace CSV) that picks the resident experts")
    c.add_argument("--slots", help="slots per layer, or 'auto' (default: auto with a profile, else 0)")
    c.add_argument("--no-mtp", action="store_true", help="no MTP drafts even if the model has a NextN block")
    c.add_argument("--async-cpu", action=argparse.BooleanOptionalAction, default=False,
                   help="run the host-memory experts while the GPU computes the resident ones (off by default: two "
                   "more splits per layer cost what the overlap hides)")
    c.add_argument("--mmap", action=argparse.BooleanOptionalAction, default=None,
                   help="--no-mmap: read the experts into pinned host memory (prompts ~5x faster on the H200 box, the "
                   "model's expert bytes held in RAM); --mmap: map the file. Default: pinned when the free RAM holds "
                   "the experts + 10 %% + 4 GiB, else mmap (config: [app] mmap = true|false)")
    c.add_argument("--no-auto-profile", action="store_true", help="without --profile: no slots planned from the "
                   "first prompt, no profile recorded for this model or taken from an earlier session "
                   "(config: [app] auto_profile = false)")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--ctx", type=int, default=4096)
    c.add_argument("--repick", metavar="N[:M]|auto", help="re-pick residents every N decode tokens, at most M swaps "
                   "per layer (default: static); auto: plan from the profile's first half, score each N on its second "
                   "half with this machine's calibration, then decide again every 256 tokens on the chat's own routing "
                   "(pays mostly with --no-mmap and a drifting workload)")
    c.set_defaults(func=cmd_chat)

    mo = sub.add_parser("models", help="the GGUF models found here (Hugging Face cache, LM Studio, [app] model_dirs, "
                        "this folder): size, arch, experts and whether they fit this machine")
    mo.add_argument("dirs", nargs="*", help="more folders to search")
    mo.set_defaults(func=cmd_models)

    ap = sub.add_parser("app", help="(default) the chat app on the default model")
    ap.set_defaults(func=cmd_app)

    m = sub.add_parser("demo", help="greedy text from the bundled model, without the app")
    m.add_argument("-p", "--prompt", default="def parse_args(argv):\n")
    m.add_argument("-n", "--n-predict", type=int, default=64)
    m.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from moeslots.engine.build import BuildError
    from moeslots.engine.errors import EngineError

    parser = build_parser()
    from moeslots import bench_app

    a = parser.parse_args(bench_app.rewrite_argv(list(sys.argv[1:] if argv is None else argv)))
    if a.cmd is None:
        a = parser.parse_args(["app"])
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
    except OSError as e:                         # a full disk, a folder where a file goes, no permission...
        _err(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e))
        return 2
    except Exception as e:
        from moeslots.profiles.trace import TraceError

        if isinstance(e, TraceError):            # a profile that cannot be read or written: the line says which
            _err(str(e))
            return 2
        raise
