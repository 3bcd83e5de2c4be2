"""ctypes bindings: the patched engine's extra C functions, ggml structs and helpers llama-cpp-python lacks
(tensor_buft_overrides, device enumeration, quiet logging)."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
from functools import lru_cache
from typing import Any

from ..errors import EngineError, NotPatchedError

GGML_BACKEND_DEVICE_TYPE_CPU = 0
GGML_BACKEND_DEVICE_TYPE_GPU = 1
GGML_BACKEND_DEVICE_TYPE_IGPU = 2
GGML_BACKEND_DEVICE_TYPE_ACCEL = 3
_DEV_TYPE_NAMES = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "ACCEL", 4: "META"}

# expert tensors of every arch build_moe_ffn serves (split gate/up, merged gate_up, "ch" variants)
EXPERT_TENSOR_PATTERN = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def _install_hint() -> str:
    return "build it with `make` or `moeslots engine build` (see README)"


@lru_cache(maxsize=1)
def llama() -> Any:
    """The llama_cpp.llama_cpp module, with the backend initialised and its logging routed through us."""
    try:
        import llama_cpp.llama_cpp as L
    except ImportError as e:
        raise NotPatchedError(f"the engine (llama-cpp-python) is not installed: {_install_hint()}") from e
    except OSError as e:  # a broken .so (e.g. a CUDA build on a machine without the CUDA runtime)
        raise EngineError(f"the engine library failed to load: {e}") from e
    L.llama_backend_init()
    _set_quiet_logging(L)
    _bind(L._lib)
    from . import gil

    gil.hold_gil(L)                      # per-token calls keep the GIL: only llama_decode lets go of it
    return L


def lib() -> Any:
    return llama()._lib


# ---------------------------------------------------------------------------------------------------------------
# logging: llama.cpp logs a lot; keep errors (and everything with MOESLOTS_VERBOSE=1), remember recent lines

_LOG_KEEP: list[str] = []
_LOG_CB: Any = None   # keep the CFUNCTYPE alive for the process lifetime
_LOG_ECHO = [True]    # False while a full-screen app owns the terminal (Textual draws on stderr)


def set_log_echo(on: bool) -> None:
    """Echo engine errors to stderr (default) or only keep them for messages (while the app runs)."""
    _LOG_ECHO[0] = on
GGML_LOG_LEVEL_ERROR = 4
GGML_LOG_LEVEL_CONT = 5


def _set_quiet_logging(L: Any) -> None:
    global _LOG_CB
    verbose = os.environ.get("MOESLOTS_VERBOSE") == "1"
    last_level = [0]

    def cb(level: int, text: bytes, _ud: Any) -> None:
        if level == GGML_LOG_LEVEL_CONT:
            level = last_level[0]
        last_level[0] = level
        s = text.decode("utf-8", "replace") if text else ""
        _LOG_KEEP.append(s)
        del _LOG_KEEP[:-200]
        if verbose or (_LOG_ECHO[0] and level >= GGML_LOG_LEVEL_ERROR):
            sys.stderr.write(s)

    _LOG_CB = L.llama_log_callback(cb)
    L.llama_log_set(_LOG_CB, None)


def recent_log(n: int = 20) -> str:
    """The engine's last log lines (all levels): shown when a load fails, to say why."""
    return "".join(_LOG_KEEP[-n:])


# ---------------------------------------------------------------------------------------------------------------
# symbols llama-cpp-python does not bind


def _bind(L: Any) -> None:
    c = ctypes
    L.ggml_backend_dev_count.restype = c.c_size_t
    L.ggml_backend_dev_count.argtypes = []
    L.ggml_backend_dev_get.restype = c.c_void_p
    L.ggml_backend_dev_get.argtypes = [c.c_size_t]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(L, fn).restype = c.c_char_p
        getattr(L, fn).argtypes = [c.c_void_p]
    L.ggml_backend_dev_type.restype = c.c_int
    L.ggml_backend_dev_type.argtypes = [c.c_void_p]
    L.ggml_backend_dev_memory.restype = None
    L.ggml_backend_dev_memory.argtypes = [c.c_void_p, c.POINTER(c.c_size_t), c.POINTER(c.c_size_t)]
    L.ggml_backend_cpu_buffer_type.restype = c.c_void_p
    L.ggml_backend_cpu_buffer_type.argtypes = []
    L.ggml_nbytes.restype = c.c_size_t
    L.ggml_nbytes.argtypes = [c.c_void_p]
    L.ggml_backend_tensor_get.restype = None
    L.ggml_backend_tensor_get.argtypes = [c.c_void_p, c.c_void_p, c.c_size_t, c.c_size_t]
    if hasattr_symbol(L, "llama_moeslots_version"):
        L.llama_moeslots_version.restype = c.c_char_p
        L.llama_moeslots_version.argtypes = []
        L.llama_moeslots_patch_id.restype = c.c_char_p
        L.llama_moeslots_patch_id.argtypes = []


def hasattr_symbol(L: Any, name: str) -> bool:
    try:
        getattr(L, name)
        return True
    except AttributeError:
        return False


class ggml_tensor(ctypes.Structure):
    """struct ggml_tensor of ggml.h (this vendored version); sizeof == 336 (checked in tests)."""


ggml_tensor._fields_ = [
    ("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
    ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
    ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p),
    ("padding", ctypes.c_char * 8),
]
TENSOR_NAME_OFFSET = ggml_tensor.name.offset


class llama_model_tensor_buft_override(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


class BuftOverrides:
    """A NULL-terminated C array of {pattern, buft}; keeps its strings alive as long as it lives."""

    def __init__(self, rules: list[tuple[str, int]]):
        self._patterns = [p.encode() for p, _ in rules]
        self.array = (llama_model_tensor_buft_override * (len(rules) + 1))()
        for i, (pat, (_, buft)) in enumerate(zip(self._patterns, rules)):
            self.array[i].pattern = pat
            self.array[i].buft = buft
        self.array[len(rules)].pattern = None
        self.array[len(rules)].buft = None

    @property
    def pointer(self) -> int:
        return ctypes.addressof(self.array)


def experts_pattern(keep_layer: int | None = None) -> str:
    """The tensor-name regex of the experts that go to host memory; keep_layer: that block's experts stay with
    the rest of its layer (the NextN/MTP head on the GPU). std::regex (ECMAScript) supports the lookahead."""
    if keep_layer is None:
        return EXPERT_TENSOR_PATTERN
    return rf"^blk\.(?!{int(keep_layer)}\.)\d+{EXPERT_TENSOR_PATTERN}"


def experts_on_host_overrides(keep_layer: int | None = None) -> BuftOverrides:
    """`-ot exps=CPU`: expert tensors in host memory (pinned CUDA_Host when the load does not mmap)."""
    return BuftOverrides([(experts_pattern(keep_layer), lib().ggml_backend_cpu_buffer_type())])


# ---------------------------------------------------------------------------------------------------------------
# patch check and devices


def patch_version() -> str | None:
    """The moeslots version string compiled into the engine, or None for a stock llama-cpp-python."""
    L = lib()
    if not hasattr_symbol(L, "llama_moeslots_version"):
        return None
    return L.llama_moeslots_version().decode()


def engine_patch_id() -> str | None:
    L = lib()
    if not hasattr_symbol(L, "llama_moeslots_patch_id"):
        return None
    return L.llama_moeslots_patch_id().decode()


def expected_patch_id() -> str | None:
    """The id of the patch series shipped with this moeslots (None when the patches are not on disk)."""
    from ..build import patchset

    files = patchset.patch_files()
    return patchset.patches_hash(files) if files else None


def require_patched() -> str:
    """Refuse to run the product on a stock or stale engine; returns the version string."""
    v = patch_version()
    if v is None:
        import llama_cpp

        raise NotPatchedError(f"the installed llama-cpp-python {llama_cpp.__version__} is not the moeslots-patched "
                              f"engine: {_install_hint()}")
    want, have = expected_patch_id(), engine_patch_id()
    if want is not None and have != want and os.environ.get("MOESLOTS_ALLOW_STALE_ENGINE") != "1":
        raise NotPatchedError(f"the installed engine was built from patches {have}, this checkout has {want}: "
                              f"rebuild with `moeslots engine build`")
    return v


@dataclasses.dataclass(frozen=True)
class Device:
    index: int
    name: str
    description: str
    kind: str
    free: int
    total: int


def devices() -> list[Device]:
    L = lib()
    out = []
    for i in range(L.ggml_backend_dev_count()):
        d = L.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        L.ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
        out.append(Device(i, (L.ggml_backend_dev_name(d) or b"").decode(),
                          (L.ggml_backend_dev_description(d) or b"").decode(),
                          _DEV_TYPE_NAMES.get(L.ggml_backend_dev_type(d), "?"), free.value, total.value))
    return out


def gpus() -> list[Device]:
    return [d for d in devices() if d.kind in ("GPU", "iGPU")]


@dataclasses.dataclass
class DoctorReport:
    engine: str
    patched: bool
    up_to_date: bool
    version: str | None
    patch_id: str | None
    expected_patch_id: str | None
    devices: list[Device]
    cpu_threads: int
    system_info: str
    problem: str | None = None

    def lines(self) -> list[tuple[str, str]]:
        rows = [("engine", self.engine)]
        if self.problem:
            rows.append(("problem", self.problem))
        pv = "yes" if self.patched else "NO (stock llama-cpp-python: the product refuses to run on it)"
        if self.patched:
            pv += f" ({self.version})"
            if not self.up_to_date:
                pv += f"; STALE: this checkout's patches are {self.expected_patch_id}, rebuild"
        rows.append(("patched", pv))
        gpus_ = [d for d in self.devices if d.kind in ("GPU", "iGPU")]
        if not gpus_:
            rows.append(("gpu", "none (experts and everything else run on the CPU)"))
        for d in gpus_:
            rows.append((f"gpu {d.name}", f"{d.description}: {d.free / 2**30:.1f} GiB free of "
                                          f"{d.total / 2**30:.1f} GiB"))
        backends = sorted({d.kind + ":" + d.name for d in self.devices})
        rows.append(("backends", ", ".join(backends) or "none"))
        rows.append(("cpu threads", str(self.cpu_threads)))
        rows.append(("cpu features", self.system_info))
        return rows


def doctor_report() -> DoctorReport:
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        L = llama()
    except EngineError as e:
        return DoctorReport("not installed", False, False, None, None, expected_patch_id(), [], threads, "", str(e))
    import llama_cpp

    v = patch_version()
    pid, want = engine_patch_id(), expected_patch_id()
    info = L.llama_print_system_info().decode().strip()
    feats = " ".join(tok.split(" = ")[0].split(":")[-1].strip() for tok in info.split("|")
                     if tok.strip().endswith("= 1"))
    return DoctorReport(f"llama-cpp-python {llama_cpp.__version__} at {os.path.dirname(llama_cpp.__file__)}",
                        v is not None, v is not None and (want is None or pid == want), v, pid, want, devices(),
                        threads, feats.strip())
