"""`moeslots engine build` and `moeslots doctor`: the patched engine built and installed, and whether it is current;
this machine's GPUs, threads and calibration."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import UserError


def cmd_engine_build(a: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..engine.build import wheel as build

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


def cmd_doctor(a: argparse.Namespace) -> int:
    from ..engine.native import lib as native

    rep = native.doctor_report()
    for k, v in rep.lines():
        print(f"{k:<16} {v}")
    from ..engine.machine import hardware

    warn = hardware.cpu_engine_warning(hardware.probe_gpus(), any(d.kind in ("GPU", "iGPU") for d in rep.devices))
    if warn:
        print(f"{'warning':<16} {warn}")
    if not (rep.patched and rep.up_to_date):
        return 1
    if a.calibrate:
        from ..engine.machine import calibrate

        print(f"calibrating with {a.calibrate} (uploads, CPU expert rate by threads, per-token base)...",
              file=sys.stderr)
        try:
            c = calibrate.run(Path(a.calibrate), threads=a.threads, log=lambda m: print(f"  {m}", file=sys.stderr))
        except (OSError, ValueError) as e:
            raise UserError(f"calibration failed: {e}") from None
        print(f"calibration      {c.render()}", flush=True)
        p = calibrate.save(c)
        print(f"saved            {p} [calibration.\"{c.machine}\"]: --repick auto and --policy auto now use "
              "these costs")
    else:
        from ..engine.machine import calibrate

        found = calibrate.load_all()
        if not found:
            print("calibration      none for this machine (--policy auto measures its own the first time a model "
                  "runs with a GPU; moeslots doctor --calibrate MODEL measures everything)")
        for c in found:
            what = ("full" if c.kind == "full" else
                    f"first run, {c.shape}, {c.threads} threads, {c.memory} experts, {c.seconds:.0f} s")
            print(f"calibration      [{what}] {c.render()}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
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
    d.add_argument("--calibrate", metavar="MODEL", help="measure this machine's upload (pinned, pageable; single "
                   "and batched copies), CPU expert (by thread count) and per-token rates with MODEL and store them "
                   "in config.toml for --repick auto and --policy auto (no GPU: uploads not measured, the H200 box's "
                   "used)")
    d.add_argument("--threads", type=int, default=None)
    d.set_defaults(func=cmd_doctor)

