"""The engine's cheap per-token C calls keep the GIL.

ctypes releases the GIL around every call into a CDLL and takes it back afterwards. Taking it back waits, when
another thread is running Python (the app's UI), until that thread gives it up: up to the interpreter's switch
interval (5 ms by default) per call. A plain decode step made about six such calls (stats batch mark, decode,
logits, token piece, end-of-generation checks), so a busy UI thread could add milliseconds to every token.
These calls take microseconds, so they are rebound here through a PyDLL handle of the same library, which keeps
the GIL: a decode step now lets go of it once, inside `llama_decode`, where the work is.
"""

from __future__ import annotations

import ctypes
from typing import Any

# called per token or per step, each a few microseconds, none blocks or waits on another thread
CHEAP = (
    "llama_get_logits_ith", "llama_get_logits", "llama_token_to_piece", "llama_vocab_is_eog",
    "llama_get_memory", "llama_memory_seq_rm", "llama_model_get_vocab", "llama_vocab_n_tokens",
    "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith", "llama_moeslots_stats_batch",
    "llama_moeslots_graph_splits", "llama_moeslots_weight_copy_bytes",
)


_DONE: set[int] = set()      # the libraries already rebound (one per process: the engine's, loaded once)


def hold_gil(module: Any, names: tuple[str, ...] = CHEAP) -> list[str]:
    """Rebind `names` on llama_cpp's module, its CDLL and llama_cpp_ext (which shares that CDLL) to functions that
    keep the GIL; argtypes and restype are copied (those set later on the CDLL land on the new function).
    Returns the names rebound (symbols the library lacks are skipped)."""
    lib = module._lib
    if id(lib) in _DONE:
        return []
    py = ctypes.PyDLL(lib._name, handle=lib._handle)
    ext: Any
    try:
        import llama_cpp.llama_cpp_ext as ext
    except ImportError:
        ext = None
    done = []
    for name in names:
        if _has(lib, name):
            old = getattr(lib, name)
            new = getattr(py, name)
            new.argtypes, new.restype = old.argtypes, old.restype
            setattr(lib, name, new)
            for mod in (module, ext):
                if mod is not None and getattr(mod, name, None) is old:
                    setattr(mod, name, new)
            done.append(name)
        fn = getattr(ext, name, None) if ext is not None else None
        if fn is not None and releases_gil(fn) and fn.argtypes is not None:
            # llama_cpp_ext binds some symbols under mangled C++ names: the same function by its address
            addr = ctypes.cast(fn, ctypes.c_void_p).value
            assert addr is not None             # a bound C function's address
            setattr(ext, name, ctypes.PYFUNCTYPE(fn.restype, *fn.argtypes)(addr))
            done.append(name)
    _DONE.add(id(lib))
    return sorted(set(done))


def _has(lib: Any, name: str) -> bool:
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False


def releases_gil(fn: Any) -> bool:
    """Whether a ctypes foreign function lets go of the GIL while it runs (CDLL) or keeps it (PyDLL)."""
    return not (fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI)  # type: ignore[attr-defined]
