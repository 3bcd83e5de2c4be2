"""Build the patched engine: llama-cpp-python 0.3.36 from PyPI's sdist + engine/patches/*.patch.

Pipeline: download sdist (pip) -> check sha256 -> unpack -> apply patches in order (engine.source,
engine.patchset) -> build a wheel with scikit-build-core -> cache it under ${XDG_CACHE_HOME:-~/.cache}/moeslots/
keyed by (sdist hash, patches hash, build flags) -> install into the running interpreter's environment. This module
holds the flags, the key, the wheel build and install, and ensure_engine() which runs the pipeline.

A rebuild with nothing changed is a key comparison (no download, no compile). The build directory is kept per
flag set, so a patch that touches only src/ rebuilds incrementally.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ..errors import BuildError
from ..machine import hardware
from .patchset import PATCHES_DIR, patch_files, patches_hash
from .source import EXPORT_STAMP, SDIST_SHA256, prepare_source, sync_tree, tree_size

MARKER_NAME = "moeslots-engine.json"

# ---------------------------------------------------------------------------------------------------------------
# keys and paths


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "moeslots"


def _cpu_fingerprint() -> str:
    """A native (-march=native) build only runs where its CPU flags exist: key it by them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return hashlib.sha256(line.encode()).hexdigest()[:12]
    except OSError:
        pass
    import platform

    return platform.machine()


def detect_cuda_arch() -> str | None:
    """Compute capability of the first GPU as CMake wants it ("90"), or None when no GPU answers."""
    gpus = hardware.probe_gpus()
    return gpus[0].arch if gpus else None


def choose_flags(request: str = "auto", *, cuda_arch: str | None = None, native: bool = True, mtmd: bool = False,
                 extra: tuple[str, ...] = (),
                 probe: Callable[[], tuple[Sequence[hardware.Gpu], hardware.Toolkit | None]] | None = None
                 ) -> tuple[BuildFlags, str]:
    """The flags for `moeslots engine build`: request "auto" builds CUDA when nvidia-smi lists a GPU and nvcc is
    found (arch from the GPU), "cpu"/"cuda" force a backend. Returns them with the one line that says why.
    probe() -> (GPUs, toolkit) replaces the real nvidia-smi/nvcc probes (tests)."""
    gpus, toolkit = probe() if probe else (hardware.probe_gpus(), hardware.probe_nvcc())
    b = hardware.choose_backend(request, gpus, toolkit, cuda_arch)
    return BuildFlags(cuda=b.cuda, cuda_arch=b.arch, native=native, mtmd=mtmd, extra=extra), b.reason


@dataclasses.dataclass(frozen=True)
class BuildFlags:
    cuda: bool = False
    cuda_arch: str | None = None     # e.g. "90"; None -> detected at build time, else 90
    native: bool = True              # -march=native for the CPU backend
    mtmd: bool = False               # llama-cpp-python's multimodal lib (not used by moeslots)
    extra: tuple[str, ...] = ()      # extra -D... cmake args

    def resolved(self) -> "BuildFlags":
        if self.cuda and not self.cuda_arch:
            return dataclasses.replace(self, cuda_arch=detect_cuda_arch() or "90")
        return self

    def cmake_args(self, patch_id: str) -> list[str]:
        f = self.resolved()
        args = [f"-DGGML_NATIVE={'ON' if f.native else 'OFF'}", f"-DLLAVA_BUILD={'ON' if f.mtmd else 'OFF'}",
                f"-DMOESLOTS_PATCH_ID={patch_id}",
                # A toolchain that links libstdc++ statically (some GCC builds under /opt do) leaves a full copy
                # of it, exported, in every .so: libllama then binds std:: symbols to libggml-cuda's copy or its
                # own depending on import order, and crashed in llama_model::print_info when numpy/gguf were
                # imported first. Keep each library's static archives private.
                "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL",
                # No AMX weight buffers: ggml's AMX matmul segfaults on Sapphire-Rapids-class CPUs
                # (ggml-org/llama.cpp#20824; reproduced on Q8_0/Q4_K here). -U drops the macro -march=native
                # defines, so the AMX code is not compiled and those weights stay in plain or repacked buffers.
                "-DCMAKE_C_FLAGS=-U__AMX_INT8__", "-DCMAKE_CXX_FLAGS=-U__AMX_INT8__"]
        if f.cuda:
            args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={f.cuda_arch}-real"]
        args += list(f.extra)
        return args

    def describe(self) -> str:
        f = self.resolved()
        s = f"CUDA sm_{f.cuda_arch}" if f.cuda else "CPU"
        return s + (" native" if f.native else "")


def build_key(sdist_sha256: str, patch_id: str, flags: BuildFlags) -> str:
    f = flags.resolved()
    material = {
        "sdist": sdist_sha256, "patches": patch_id, "cmake": f.cmake_args(patch_id),
        "cpu": _cpu_fingerprint() if f.native else "generic", "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
    }
    if f.cuda:      # the backend, named (CPU keys predate the field: left without it, their cached wheels stay valid)
        material["backend"] = f"cuda-{f.cuda_arch}"
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:20]


# ---------------------------------------------------------------------------------------------------------------
# steps


def check_toolchain(flags: BuildFlags) -> None:
    missing = []
    if not shutil.which("cmake"):
        missing.append("cmake (pip install cmake, or your package manager)")
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        missing.append("a C++ compiler (apt install build-essential)")
    if flags.cuda and not (shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()):
        missing.append("nvcc (the CUDA toolkit) for --cuda")
    try:
        import scikit_build_core  # noqa: F401
    except ImportError:
        missing.append(f"scikit-build-core in {sys.executable} (pip install scikit-build-core)")
    if missing:
        raise BuildError("cannot build the engine, missing: " + "; ".join(missing))


_NINJA = re.compile(r"\[(\d+)/(\d+)\]")


def build_wheel(tree: Path, flags: BuildFlags, patch_id: str, build_dir: Path, wheel_dir: Path, log_path: Path,
                progress: Callable[[int, int, str], None] | None = None) -> Path:
    check_toolchain(flags)
    wheel_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["CMAKE_ARGS"] = " ".join(flags.cmake_args(patch_id))
    if flags.cuda and not shutil.which("nvcc") and Path("/usr/local/cuda/bin/nvcc").exists():
        env["PATH"] = "/usr/local/cuda/bin:" + env.get("PATH", "")
        env.setdefault("CUDACXX", "/usr/local/cuda/bin/nvcc")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    cmd = [sys.executable, "-m", "pip", "wheel", "-v", str(tree), "--no-deps", "--no-build-isolation",
           "--no-index", "-w", str(wheel_dir), "-C", f"build-dir={build_dir}"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: list[str] = []
    with open(log_path, "w") as logf:
        logf.write("CMAKE_ARGS=" + env["CMAKE_ARGS"] + "\n" + " ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            tail.append(line.rstrip())
            del tail[:-40]
            m = _NINJA.search(line)
            if m and progress:
                progress(int(m.group(1)), int(m.group(2)), line.strip()[-80:])
        rc = proc.wait()
    if rc != 0:
        raise BuildError(f"engine build failed (exit {rc}); last lines:\n" + "\n".join(tail[-15:]) +
                         f"\nfull log: {log_path}")
    wheels = sorted(wheel_dir.glob("llama_cpp_python-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise BuildError(f"the build finished but wrote no wheel into {wheel_dir}; log: {log_path}")
    return wheels[-1]


def marker_path() -> Path:
    return Path(sys.prefix) / MARKER_NAME


def installed_key() -> str | None:
    try:
        return json.loads(marker_path().read_text()).get("key")
    except (OSError, ValueError):
        return None


def install_wheel(wheel: Path, key: str) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", "--no-index", str(wheel)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError("installing the engine wheel failed:\n" + (r.stdout + r.stderr).strip()[-2000:])
    missing = [m for m in ("numpy", "diskcache", "jinja2", "typing_extensions") if not _importable(m)]
    if missing:
        raise BuildError(f"engine installed, but its dependencies are missing: {', '.join(missing)} "
                         f"(pip install {' '.join(missing)})")
    marker_path().write_text(json.dumps({"key": key, "wheel": str(wheel), "time": time.time()}))


def _installed_patch_id() -> str | None:
    """The patch id compiled into the installed engine (None: stock, or it does not load), read in a child process
    so this one never maps a library it may be about to replace."""
    code = "from moeslots.engine.native import lib; print(lib.engine_patch_id())"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = r.stdout.strip().splitlines()
    return out[-1] if r.returncode == 0 and out and out[-1] != "None" else None


def _importable(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


# ---------------------------------------------------------------------------------------------------------------
# orchestration


@dataclasses.dataclass
class BuildResult:
    key: str
    wheel: Path
    action: str            # "up-to-date" | "installed-cached" | "built"
    seconds: float


@contextlib.contextmanager
def _build_lock(cache: Path, log: Callable[[str], None]) -> Iterator[None]:
    """One build at a time per cache: two builds sharing a build dir corrupt it (seen when a test started a
    build while another ran: the wheel came out without its libraries)."""
    import fcntl

    with open(cache / "build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another engine build is running; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_engine(flags: BuildFlags, *, force: bool = False, from_source: Path | None = None,
                  cache: Path | None = None, patches_dir: Path = PATCHES_DIR,
                  log: Callable[[str], None] = print,
                  progress: Callable[[int, int, str], None] | None = None) -> BuildResult:
    t0 = time.perf_counter()
    cache = cache or cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    with _build_lock(cache, log):
        return _ensure_engine_locked(flags, force, from_source, cache, patches_dir, log, progress, t0)


def _ensure_engine_locked(flags: BuildFlags, force: bool, from_source: Path | None, cache: Path, patches_dir: Path,
                          log: Callable[[str], None], progress: Callable[[int, int, str], None] | None,
                          t0: float) -> BuildResult:
    patches = patch_files(patches_dir)
    patch_id = patches_hash(patches)
    if from_source is not None:
        stamp = from_source / EXPORT_STAMP
        if not stamp.exists():
            raise BuildError(f"{from_source} is not a tree written by `moeslots engine build --export-source`")
        info = json.loads(stamp.read_text())
        if info.get("patch_id") != patch_id:
            raise BuildError(f"{from_source} holds patches {info.get('patch_id')}, this checkout has {patch_id}: "
                             "export it again")
    key = build_key(SDIST_SHA256, patch_id, flags)
    wheel_dir = cache / "wheels" / key
    cached = sorted(wheel_dir.glob("llama_cpp_python-*.whl"))
    if not force and installed_key() == key and cached and _importable("llama_cpp") \
            and _installed_patch_id() == patch_id:     # the marker alone misses a pip install over the engine
        return BuildResult(key, cached[-1], "up-to-date", time.perf_counter() - t0)
    if cached and not force:
        log(f"installing cached engine wheel {key}")
        install_wheel(cached[-1], key)
        return BuildResult(key, cached[-1], "installed-cached", time.perf_counter() - t0)
    # one build dir per backend: CMake reconfigures in place when other flags change, so only what they touch
    # rebuilds (MOESLOTS_BUILD_DIR overrides, e.g. for a CI cache)
    f = flags.resolved()
    build_dir = Path(os.environ.get("MOESLOTS_BUILD_DIR") or
                     cache / "build" / (f"cuda{f.cuda_arch}" if f.cuda else "cpu"))
    tree = cache / "source"   # a stable path: CMake's build dir remembers its source dir
    if from_source is not None:
        changed = sync_tree(from_source, tree)
    else:
        log(f"preparing patched source ({len(patches)} patches, id {patch_id})")
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            fresh = prepare_source(Path(tmp) / "src", cache, patches, trim=False, log=log)
            changed = sync_tree(fresh, tree)
    log(f"building engine wheel ({flags.describe()}, {changed} source files changed); log: {cache / 'build.log'}")
    if wheel_dir.exists():
        shutil.rmtree(wheel_dir)
    wheel = build_wheel(tree, flags, patch_id, build_dir, wheel_dir, cache / "build.log", progress)
    install_wheel(wheel, key)
    return BuildResult(key, wheel, "built", time.perf_counter() - t0)


def export_source(dest: Path, *, cache: Path | None = None, patches_dir: Path = PATCHES_DIR,
                  log: Callable[[str], None] = print) -> tuple[Path, int]:
    """Write the patched, trimmed source tree to dest; returns (dest, bytes)."""
    cache = cache or cache_root()
    root = prepare_source(dest, cache, patch_files(patches_dir), trim=True, log=log)
    return root, tree_size(root)
