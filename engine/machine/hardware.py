"""What this machine has, and the choices that follow from it: which engine to build (CUDA when an NVIDIA GPU and a
CUDA toolkit are both there) and how to load a model's experts (pinned host memory when the free RAM holds them
with a margin, else mmap).

Each probe takes its source as an argument (a command runner, a `which`, the text of /proc/meminfo), so the
decisions are pure functions the tests drive with fakes. Nothing here loads the engine library.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Sequence

GiB = 1 << 30
CUDA_NVCC_FALLBACK = Path("/usr/local/cuda/bin/nvcc")
DEFAULT_CUDA_ARCH = "90"
# pinned memory when MemAvailable >= experts * (1 + PIN_SHARE) + PIN_MARGIN: the rest of the process (KV cache,
# the GPU runtime's own host buffers, the app) and the rest of the machine keep room
PIN_MARGIN = 4 * GiB
PIN_SHARE = 0.10

Runner = Callable[[Sequence[str]], "str | None"]      # runs a command, returns its stdout (None: failed)
Which = Callable[[str], "str | None"]


def run_command(cmd: Sequence[str], timeout: float = 20.0) -> str | None:
    """stdout of cmd, or None when it cannot run, fails or hangs."""
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


# ---------------------------------------------------------------------------------------------------------------
# probes


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str                 # "NVIDIA H200"
    compute_cap: str          # "9.0" ("" when the driver does not say)
    total_mib: int
    free_mib: int

    @property
    def arch(self) -> str | None:
        """CMake's CUDA architecture number ("90"), or None when the compute capability is unknown."""
        return self.compute_cap.replace(".", "") if re.fullmatch(r"\d+\.\d+", self.compute_cap) else None


def probe_gpus(run: Runner = run_command, which: Which = shutil.which) -> list[Gpu]:
    """The NVIDIA GPUs nvidia-smi lists (none when it is missing or fails: no driver, no device)."""
    smi = which("nvidia-smi")
    if not smi:
        return []
    out = run([smi, "--query-gpu=name,compute_cap,memory.total,memory.free", "--format=csv,noheader,nounits"])
    return parse_nvidia_smi(out or "")


def parse_nvidia_smi(text: str) -> list[Gpu]:
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0] or parts[0].startswith(("No devices", "NVIDIA-SMI has failed")):
            continue
        try:
            total, free = int(float(parts[2])), int(float(parts[3]))
        except ValueError:
            continue
        cap = parts[1] if re.fullmatch(r"\d+\.\d+", parts[1]) else ""
        gpus.append(Gpu(parts[0], cap, total, free))
    return gpus


@dataclasses.dataclass(frozen=True)
class Toolkit:
    nvcc: str                 # path of nvcc
    version: str              # "13.0" ("" when nvcc does not say)


def probe_nvcc(run: Runner = run_command, which: Which = shutil.which,
               fallback: Path = CUDA_NVCC_FALLBACK) -> Toolkit | None:
    """The CUDA toolkit: nvcc on PATH, else /usr/local/cuda/bin/nvcc; None when neither runs."""
    nvcc = which("nvcc") or (str(fallback) if fallback.exists() else None)
    if not nvcc:
        return None
    out = run([nvcc, "--version"])
    if out is None:
        return None
    m = re.search(r"release (\d+\.\d+)", out)
    return Toolkit(nvcc, m.group(1) if m else "")


def mem_available(meminfo: str | None = None) -> int | None:
    """MemAvailable of /proc/meminfo in bytes (the text may be given); None where it cannot be read."""
    if meminfo is None:
        try:
            meminfo = Path("/proc/meminfo").read_text()
        except OSError:
            return None
    m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", meminfo, re.M)
    return int(m.group(1)) * 1024 if m else None


# ---------------------------------------------------------------------------------------------------------------
# which engine to build


@dataclasses.dataclass(frozen=True)
class Backend:
    cuda: bool
    arch: str | None          # CUDA architecture ("90") when cuda
    reason: str               # one line: which engine and why


def choose_backend(request: str, gpus: Sequence[Gpu], toolkit: Toolkit | None, arch: str | None = None) -> Backend:
    """request: "auto" (CUDA when nvidia-smi lists a GPU and nvcc is found), "cpu" or "cuda" (forced).
    arch: an explicit CUDA architecture (--cuda-arch), else the first GPU's compute capability, else 90."""
    if request not in ("auto", "cpu", "cuda"):
        raise ValueError(f"engine backend must be auto, cpu or cuda, not {request!r}")
    gpu = gpus[0] if gpus else None
    nvcc = f"nvcc {toolkit.version}".rstrip() if toolkit else ""
    if request == "cpu":
        return Backend(False, None, "building the CPU engine: --cpu given" +
                       (f" ({gpu.name} present)" if gpu else ""))
    if request == "cuda" or (gpu is not None and toolkit is not None):
        a = arch or (gpu.arch if gpu else None) or DEFAULT_CUDA_ARCH
        src = "--cuda-arch" if arch else ("from the GPU" if gpu and gpu.arch else "default, no GPU answered")
        if request == "cuda":
            return Backend(True, a, f"building the CUDA engine: --cuda given (sm_{a}, {src})" +
                           (f"; {nvcc} found" if toolkit else "; no nvcc found yet"))
        return Backend(True, a, f"building the CUDA engine: {gpu.name} (sm_{a}) and {nvcc} found")  # type: ignore[union-attr]
    if gpu is None:
        extra = f" ({nvcc} is installed, but nvidia-smi lists no GPU)" if toolkit else ""
        return Backend(False, None, f"building the CPU engine: no NVIDIA GPU found{extra}")
    return Backend(False, None, f"building the CPU engine: {gpu.name} found but no CUDA toolkit (nvcc is neither on "
                                f"PATH nor {CUDA_NVCC_FALLBACK}); install it and run `make engine` again for CUDA")


def cpu_engine_warning(gpus: Sequence[Gpu], engine_has_gpu: bool) -> str | None:
    """`moeslots doctor`: a GPU the installed engine cannot use deserves a warning and the command that fixes it."""
    if not gpus or engine_has_gpu:
        return None
    return (f"{gpus[0].name} is present but the installed engine is CPU-only: build the CUDA engine with "
            "`make engine` (or `moeslots engine build --cuda`; needs the CUDA toolkit)")


# ---------------------------------------------------------------------------------------------------------------
# how to load the experts


@dataclasses.dataclass(frozen=True)
class LoadMode:
    mmap: bool
    line: str                 # one line for the user: which, and why


def _gib(b: float) -> str:
    return f"{b / GiB:.1f} GiB" if b >= GiB else f"{b / 2**20:.0f} MiB"


def pinned_fits(expert_bytes: int, available: int) -> bool:
    return available >= expert_bytes * (1 + PIN_SHARE) + PIN_MARGIN


def choose_load_mode(expert_bytes: int, available: int | None, override: bool | None = None) -> LoadMode:
    """mmap (pageable, the file's pages) or pinned host memory (read in: ~5x faster prompts with a GPU, faster
    expert uploads, RAM held). override: True/False from --mmap/--no-mmap or [app] mmap; None: decide from RAM."""
    if override is not None:
        how = "mapped from the file (mmap)" if override else "read into pinned host memory"
        return LoadMode(override, f"experts {how}, as asked (--mmap/--no-mmap, [app] mmap)")
    if available is None:
        return LoadMode(True, "experts mapped from the file (mmap): free RAM unknown (no /proc/meminfo)")
    need = expert_bytes * (1 + PIN_SHARE) + PIN_MARGIN
    if pinned_fits(expert_bytes, available):
        return LoadMode(False, f"experts read into pinned host memory ({_gib(expert_bytes)}; {_gib(available)} of RAM "
                               f"free >= {_gib(need)}): faster prompts and uploads than mmap (--mmap to map instead)")
    return LoadMode(True, f"experts mapped from the file (mmap): {_gib(available)} of RAM free < {_gib(need)} needed "
                          f"to pin their {_gib(expert_bytes)} (--no-mmap to pin anyway)")


def resolve_mmap(setting: bool | str, expert_bytes: int,
                 available: Callable[[], int | None] | None = None) -> LoadMode:
    """EngineConfig.mmap: True / False as given, "auto" decided from this machine's free RAM."""
    if setting == "auto":
        return choose_load_mode(expert_bytes, (available or mem_available)())
    if isinstance(setting, bool):
        return choose_load_mode(expert_bytes, None, override=setting)
    raise ValueError(f"mmap must be true, false or 'auto', not {setting!r}")
