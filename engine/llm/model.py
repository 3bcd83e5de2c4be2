"""Low-level model/context wrappers over llama-cpp-python's C API (the high-level `Llama` class cannot pass
tensor_buft_overrides, cb_eval or MTP contexts). Validation first: bad files give one clear ModelError."""

from __future__ import annotations

import atexit
import codecs
import ctypes
import dataclasses
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..errors import ClosedError, EngineError, ModelError
from ..native import expert_cache as cache
from ..native import lib as native
from ..native import routing_stats as stats
from ..native import tier
from .facts import ModelFacts, inspect_gguf

if TYPE_CHECKING:
    from ..native.expert_cache import SlotPlan
    from ..native.routing_stats import RoutingStats

# Native objects still open at interpreter exit are closed by an atexit hook, in dependency order (MTP draft
# contexts, then contexts, then models), while the interpreter and the GPU runtime are whole. Left to garbage
# collection at shutdown, a model's close could fail silently (imports no longer work) and leave its expert cache
# to be freed by a C++ static destructor after the CUDA runtime is gone: a segfault at exit (CUDA builds).
# An engine goes first: it closes its own objects, or, when a reply is still being generated on another thread,
# leaves them open (untrack), since freeing a context under a running decode would crash where leaking cannot.
_OPEN: tuple[weakref.WeakSet, ...] = tuple(weakref.WeakSet() for _ in range(4))
ENGINE, DRAFT, CONTEXT, MODEL = 0, 1, 2, 3


def track(obj: Any, rank: int) -> None:
    """Have obj.close() (or obj.close_at_exit()) called at exit if obj is still open then."""
    _OPEN[rank].add(obj)


def untrack(*objs: Any) -> None:
    for group in _OPEN:
        for obj in objs:
            if obj is not None:
                group.discard(obj)


@atexit.register
def close_all_open() -> None:
    for group in _OPEN:
        for obj in list(group):
            try:
                getattr(obj, "close_at_exit", obj.close)()
            except Exception:  # best effort at exit; the next group must still be closed
                pass


@dataclasses.dataclass
class LoadOptions:
    n_gpu_layers: int = -1              # -1: all layers on the GPU when one exists (no effect on CPU builds)
    experts_on_host: bool = True        # override expert tensors into host memory (`-ot exps=CPU`)
    use_mmap: bool = True
    load_mtp: bool = False
    mtp_head_on_gpu: bool = False       # the NextN block's experts stay with its layer (GPU) instead of host memory
    # CPU "extra" buffer types (CPU_REPACK for Q4_K/Q4_0 ...): repacked experts cannot be read back into a hot
    # pack, so a model that gets slots on a CPU-only build is loaded without them
    extra_bufts: bool = True


def _load_failure(facts: ModelFacts) -> str:
    """llama.cpp's own reason for refusing a file (its "error loading model: ..." line, not the generic last one)."""
    lines = native.recent_log(40).strip().splitlines()
    why = next((ln.split("error loading model:", 1)[1].strip() for ln in reversed(lines)
                if "error loading model:" in ln), lines[-1].strip() if lines else "unknown reason")
    if facts.n_nextn and not facts.nextn_tensors:
        why += (f" (the file declares {facts.n_nextn} NextN block(s) but carries none of their tensors; "
                f"llama.cpp loads such a {facts.arch} file only with them)")
    return why


class Model:
    """A loaded llama_model (plus its vocab). Close it, or use it as a context manager."""

    def __init__(self, path: Path, opts: LoadOptions | None = None):
        self.facts = inspect_gguf(path)
        self.opts = opts or LoadOptions()
        L = native.llama()
        self._L = L
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 999 if self.opts.n_gpu_layers < 0 else self.opts.n_gpu_layers
        mp.load_mode = L.LLAMA_LOAD_MODE_MMAP if self.opts.use_mmap else L.LLAMA_LOAD_MODE_NONE
        mp.load_mtp = bool(self.opts.load_mtp and self.facts.n_nextn > 0 and self.facts.nextn_tensors)
        mp.use_extra_bufts = self.opts.extra_bufts
        keep = self.facts.n_layer if (self.opts.mtp_head_on_gpu and mp.load_mtp) else None
        self._overrides = native.experts_on_host_overrides(keep) if self.opts.experts_on_host else None
        if self._overrides is not None:
            mp.tensor_buft_overrides = self._overrides.pointer
        self.ptr = L.llama_model_load_from_file(str(self.facts.path).encode(), mp)
        if not self.ptr:
            raise ModelError(f"the engine could not load {self.facts.path}: {_load_failure(self.facts)}")
        self.vocab = L.llama_model_get_vocab(self.ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_embd = L.llama_model_n_embd(self.ptr)
        self.mtp_loaded = bool(mp.load_mtp)
        # recurrent or hybrid memory (gated delta-net, Mamba...): positions cannot be cut back beyond the snapshots
        # a context keeps for rollback (Context(rollback=n))
        self.recurrent = bool(L.llama_model_is_recurrent(self.ptr) or L.llama_model_is_hybrid(self.ptr))
        self.n_layer_all = self.facts.n_layer + self.facts.n_nextn
        self.cache_line = "expert cache: off"
        track(self, MODEL)

    def set_slots(self, plan: "SlotPlan", *, pack_host: bool = False, max_bytes: int = 0, spare: bool = False) -> str:
        """Configure the static expert cache (between generations); returns the engine's load line.
        Contexts keep working: their graphs are rebuilt on the next decode."""
        try:
            self.cache_line = cache.configure(self.live(), self.n_layer_all, plan, pack_host=pack_host,
                                              max_bytes=max_bytes, spare=spare)
        except cache.CacheError:
            self.cache_line = "expert cache: off"
            raise
        return self.cache_line

    def live(self) -> Any:
        """The model's handle; after close(), ClosedError instead of a call into freed memory (a crash)."""
        if not self.ptr:
            raise ClosedError("the model is closed")
        return self.ptr

    def close(self) -> None:
        """Also closes what was built on it first (MTP drafts, then contexts: llama.cpp frees them before their
        model; left open they would point into freed memory, and their own close or __del__ would crash)."""
        if getattr(self, "ptr", None):
            for obj in [o for rank in (DRAFT, CONTEXT) for o in list(_OPEN[rank]) if o.model is self]:
                obj.close()         # (a user's later call on one raises ClosedError: "the model is closed")
            if native.hasattr_symbol(self._L._lib, "llama_moeslots_cache_clear"):
                cache.clear(self.ptr)   # (llama_model_free frees it too; clearing first keeps the order explicit)
            self._L.llama_model_free(self.ptr)
            self.ptr = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    # -- text ----------------------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        L = self._L
        self.live()                     # (the vocab is freed with the model)
        raw = text.encode("utf-8")
        n_max = len(raw) + 16
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, n_max, add_special, parse_special)
        if n < 0:
            buf = (L.llama_token * (-n))()
            n = L.llama_tokenize(self.vocab, raw, len(raw), buf, -n, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        L = self._L
        self.live()
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        self.live()
        return bool(self._L.llama_vocab_is_eog(self.vocab, token))


class Detokenizer:
    """Token pieces -> text, holding back incomplete UTF-8 sequences."""

    def __init__(self, model: Model):
        self.model = model
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token: int) -> str:
        return self._dec.decode(self.model.piece(token))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


def default_threads() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, n)


EvalCallback = Callable[[int, bool, Any], bool]


class Context:
    """A llama_context with a greedy-decoding helper. One sequence (seq 0)."""

    def __init__(self, model: Model, *, n_ctx: int = 2048, n_batch: int = 512, n_ubatch: int | None = None,
                 threads: int | None = None, cb_eval: Any = None, embeddings_all: bool = False,
                 kv_f32: bool = False, rollback: int = 0, op_offload: bool = True):
        L = model._L
        self.model, self._L = model, L
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_ubatch or n_batch
        cp.n_threads = cp.n_threads_batch = threads or default_threads()
        cp.no_perf = True
        # batches of >= 32 tokens: host-resident weights (the host chain's experts) streamed to the GPU by the
        # scheduler (True, llama.cpp's default) or computed where they live, on the CPU (False)
        cp.op_offload = self.op_offload = op_offload
        self.sync_first = False     # a failed take left device work queued: synchronise before the next decode
        # recurrent state snapshots for cutting back up to `rollback` positions after a decode (rejected MTP
        # drafts); only recurrent/hybrid models use them
        cp.n_rs_seq = rollback if model.recurrent else 0
        if kv_f32:                      # reference comparisons: F32 KV cache, plain attention (no flash attention)
            cp.type_k = cp.type_v = 0   # GGML_TYPE_F32
            cp.flash_attn_type = 0      # LLAMA_FLASH_ATTN_TYPE_DISABLED
        if cb_eval is not None:
            self._cb = cb_eval          # keep the CFUNCTYPE alive as long as the context
            cp.cb_eval = cb_eval
            cp.cb_eval_user_data = None
        self.n_ctx, self.n_batch = n_ctx, n_batch
        self.ptr = L.llama_init_from_model(model.live(), cp)
        if not self.ptr:
            why = native.recent_log(6).strip().splitlines()
            raise EngineError(f"could not create a context (n_ctx {n_ctx}): {why[-1] if why else 'unknown'}")
        self.n_past = 0
        # what llama.cpp granted (it clamps n_rs_seq to 0 for archs without recurrent rollback, e.g. qwen3next)
        self.rollback = int(L.llama_n_rs_seq(self.ptr)) if model.recurrent else 0
        self._batch = L.llama_batch_init(n_batch, 0, 1)
        self.stats_ring = -1                    # < 0: native routing stats off
        track(self, CONTEXT)
        self.on_chunk: Callable[[int, int], None] | None = None   # after each llama_decode: (first pos, n)

    def enable_stats(self, ring_rows: int = 4096) -> None:
        """Native routing stats for this context (per (layer, expert) picks, hits/misses, a ring of rows)."""
        stats.enable(self.live(), ring_rows)
        self.stats_ring = ring_rows

    def disable_stats(self) -> None:
        stats.disable(self.live())
        self.stats_ring = -1

    def read_stats(self) -> "RoutingStats":
        f = self.model.facts
        return stats.read(self.live(), self.model.n_layer_all, f.n_expert, f.n_expert_used, self.stats_ring)

    def live(self) -> Any:
        """The context's handle; after its close() or its model's (which closes it first), ClosedError."""
        if not self.ptr:
            raise ClosedError("the model is closed" if not self.model.ptr else "the context is closed")
        return self.ptr

    def close(self) -> None:
        if getattr(self, "ptr", None):
            for d in [o for o in list(_OPEN[DRAFT]) if o.target is self]:
                d.close()           # its MTP draft first: the draft reads this context's state (ctx_other)
            self._L.llama_batch_free(self._batch)
            self._L.llama_free(self.ptr)
            self.ptr = None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def reset(self) -> None:
        mem = self._L.llama_get_memory(self.live())
        self._L.llama_memory_clear(mem, True)
        self.n_past = 0

    def can_truncate(self, pos: int) -> bool:
        """Whether truncate(pos) keeps the state exact: always for attention KV; recurrent state never (a new turn
        resumes from a checkpoint, engine.recurrent). Its rollback snapshots serve MTP alone: they are valid only
        for the trailing tokens of the last decode call, when that call held more tokens than are rolled back and
        no rollback is pending (llama.cpp's delta-net writes min(n_tokens, n_rs_seq) snapshots and seq_rm cannot
        tell a stale one), which only MTP.step guarantees."""
        return not self.model.recurrent or pos >= self.n_past

    def truncate(self, pos: int) -> None:
        """Forget positions >= pos of seq 0 (KV and n_past): prefix reuse, rejected drafts."""
        if not self._L.llama_memory_seq_rm(self._L.llama_get_memory(self.live()), 0, pos, -1):
            raise EngineError(f"could not roll the context back to position {pos}"
                              + (" (recurrent memory keeps no state that far back)" if self.model.recurrent else ""))
        self.n_past = min(self.n_past, pos)

    def decode(self, tokens: Sequence[int], *, all_logits: bool = False, prompt: bool = False) -> None:
        """Append tokens to seq 0 in n_batch chunks; logits for the last token (or for every token).
        prompt: the routing stats count these rows as prompt rows (else decode rows)."""
        ptr = self.live()           # (one check per call: a closed context raises rather than crash)
        if self.sync_first:         # (a stale publish of a failed decode's device work must not feed this one)
            self._L.llama_synchronize(ptr)
            self.sync_first = False
        if self.n_past + len(tokens) > self.n_ctx:
            raise EngineError(f"context full: {self.n_past} + {len(tokens)} tokens > n_ctx {self.n_ctx}")
        L, b = self._L, self._batch
        for s in range(0, len(tokens), self.n_batch):
            chunk = tokens[s:s + self.n_batch]
            last_chunk = s + self.n_batch >= len(tokens)
            b.n_tokens = len(chunk)
            for i, t in enumerate(chunk):
                b.token[i] = t
                b.pos[i] = self.n_past + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = 1 if all_logits or (last_chunk and i == len(chunk) - 1) else 0
            if self.stats_ring >= 0:
                stats.mark_batch(ptr, self.n_past, len(chunk), prompt)
            rc = L.llama_decode(ptr, b)
            if rc != 0:
                why = tier.take_failure(self.model.ptr)
                self.sync_first = why is not None   # the GPU may still run that decode's queued work: let it end
                raise EngineError(why or f"llama_decode failed with code {rc}")
            if self.on_chunk is not None:
                self.on_chunk(self.n_past, len(chunk))
            self.n_past += len(chunk)

    def graph_splits(self) -> int:
        """Backend runs (splits) of the last computed graph; each boundary is a synchronisation."""
        return cache.graph_splits(self.live())

    def logits(self, i: int = -1) -> np.ndarray:
        p = self._L.llama_get_logits_ith(self.live(), i)
        return np.ctypeslib.as_array(p, shape=(self.model.n_vocab,))

    def argmax(self, i: int = -1) -> int:
        return int(np.argmax(self.logits(i)))
