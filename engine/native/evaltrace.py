"""Routing trace through `cb_eval` (no patch needed): reads `ffn_moe_topk-<il>` (a strided VIEW of the argsort,
[k, n_tokens] int32) after each layer's router. Slow (a Python call per graph node): for checks and offline
recording, never for the chat hot path (the native stats of the cache patch replace it there)."""

from __future__ import annotations

import ctypes
import dataclasses
import re
from pathlib import Path

import numpy as np

from ..llm.model import Context, LoadOptions, Model
from . import lib as native

_TOPK = re.compile(rb"^ffn_moe_topk-(\d+)$")


class RouterTracer:
    """A cb_eval callback that appends (layer, ids[n_tokens, k]) for every router evaluation."""

    def __init__(self) -> None:
        self.records: list[tuple[int, np.ndarray]] = []
        L = native.llama()
        self._lib = native.lib()
        self.callback = L.ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, tp: int, ask: bool, _ud: object) -> bool:
        m = _TOPK.match(ctypes.string_at(tp + native.TENSOR_NAME_OFFSET))
        if ask:
            return m is not None
        if m:
            t = native.ggml_tensor.from_address(tp)
            n = self._lib.ggml_nbytes(tp)
            buf = (ctypes.c_uint8 * n)()
            self._lib.ggml_backend_tensor_get(tp, buf, 0, n)
            ids = np.lib.stride_tricks.as_strided(np.frombuffer(buf, np.int32), shape=(t.ne[1], t.ne[0]),
                                                  strides=(t.nb[1], t.nb[0])).copy()
            self.records.append((int(m.group(1)), ids))
        return True   # False would abort the graph

    def by_layer(self) -> dict[int, np.ndarray]:
        out: dict[int, list[np.ndarray]] = {}
        for il, ids in self.records:
            out.setdefault(il, []).append(ids)
        return {il: np.concatenate(v) for il, v in sorted(out.items())}


@dataclasses.dataclass(frozen=True)
class RandomTrace:
    picks: dict[int, np.ndarray]     # layer -> [n_tokens, k]
    n_expert: int
    k: int


def trace_random_tokens(path: Path, n_tokens: int = 256, threads: int | None = None, seed: int = 1) -> RandomTrace:
    """Decode n_tokens uniformly random (non-control) tokens in one batch with every row output, tracing the
    router of every trunk layer."""
    with Model(path, LoadOptions(experts_on_host=True)) as model:
        tracer = RouterTracer()
        with Context(model, n_ctx=max(512, n_tokens + 8), n_batch=max(n_tokens, 32), threads=threads,
                     cb_eval=tracer.callback) as ctx:
            rng = np.random.default_rng(seed)
            normal = [t for t in range(model.n_vocab) if not model.is_eog(t)]
            toks = [int(t) for t in rng.choice(normal, size=n_tokens)]
            ctx.decode(toks, all_logits=True)
        return RandomTrace(tracer.by_layer(), model.facts.n_expert, model.facts.n_expert_used)
