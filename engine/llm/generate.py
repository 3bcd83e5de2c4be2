"""A minimal greedy generation path (`moeslots generate`): experts in host memory, everything else on the GPU
when one exists. The chat engine (engine.py) builds on the same Model/Context wrappers."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Iterator

from .model import Context, Detokenizer, LoadOptions, Model


@dataclasses.dataclass(frozen=True)
class GenStats:
    prompt_tokens: int
    prompt_seconds: float
    tokens: int
    seconds: float
    token_ids: tuple[int, ...]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def render(self) -> str:
        pp = self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0
        return (f"prompt {self.prompt_tokens} tok in {1000 * self.prompt_seconds:.1f} ms ({pp:.1f} tok/s); "
                f"generated {self.tokens} tok in {1000 * self.seconds:.1f} ms ({self.tok_s:.1f} tok/s)")


class OpenModel:
    """A model plus one context, for generate/bench commands."""

    def __init__(self, model: Model, ctx: Context):
        self.model, self.ctx = model, ctx

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def open_model(path: Path, *, n_ctx: int = 2048, threads: int | None = None, experts_on_host: bool = True,
               n_gpu_layers: int = -1) -> OpenModel:
    model = Model(path, LoadOptions(n_gpu_layers=n_gpu_layers, experts_on_host=experts_on_host))
    try:
        ctx = Context(model, n_ctx=n_ctx, threads=threads)
    except BaseException:
        model.close()
        raise
    return OpenModel(model, ctx)


def greedy_stream(om: OpenModel, prompt: str, n_predict: int) -> Iterator[str | GenStats]:
    """Yields text pieces as they decode, then one GenStats. Stops at end-of-generation tokens."""
    model, ctx = om.model, om.ctx
    ctx.reset()
    toks = model.tokenize(prompt)
    if not toks:
        toks = model.tokenize(" ")
    t0 = time.perf_counter()
    ctx.decode(toks, prompt=True)
    t1 = time.perf_counter()
    det = Detokenizer(model)
    out: list[int] = []
    for _ in range(n_predict):
        tok = ctx.argmax()
        if model.is_eog(tok):
            break
        out.append(tok)
        piece = det.push(tok)
        if piece:
            yield piece
        if ctx.n_past >= ctx.n_ctx:
            break
        ctx.decode([tok])
    rest = det.flush()
    if rest:
        yield rest
    t2 = time.perf_counter()
    yield GenStats(len(toks), t1 - t0, len(out), t2 - t1, tuple(out))
