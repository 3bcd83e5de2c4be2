"""The chat the model sees (its context window): which turns still fit when a chat outgrows the context, and how
large a context to open when none is asked for.

A full context drops the oldest turns, never the leading system prompt nor the question being asked; they stay in
the chat's history (the app's store), the model just no longer reads them. Turns leave whole (a question with the
replies that follow it), so the template still sees user and assistant alternate. The prompt must leave room for the
reply (min(max_tokens, n_ctx / 4) tokens). A cut changes the prompt right after the system prompt, so the whole
rest is read again (a recurrent model re-reads from the start: engine.recurrent.keep_prefix): a cut therefore frees
a quarter of the context more than it must, and later turns keep the same first turn while they fit, so a long chat
re-reads once every few turns, not every turn (llama.cpp's server, for the same reason, discards half).

The default context: the model's trained length (GGUF `<arch>.context_length`), at most 32768 tokens (longer costs
KV memory and prompt time a chat rarely needs), and at most what lets the KV cache take a quarter of the free memory
where it lives (VRAM with a GPU, else RAM): the rest is the margin for the compute buffers, the expert slots, the
system. `--ctx N` (EngineConfig.n_ctx) wins over all of it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

from ..api import Message
from ..errors import EngineError
from ..llm import ggufhead
from ..machine import hardware
from ..native import lib as native

if TYPE_CHECKING:
    from ..llm.model import Model

Tokens = Callable[[Sequence[Message]], list[int]]     # the prompt (template applied, tokenized) of these messages

REPLY_SHARE = 4          # the reply's room: min(max_tokens, n_ctx // REPLY_SHARE) tokens
SLACK_SHARE = 4          # a cut frees n_ctx // SLACK_SHARE more, so the next turns keep its start (and their KV)
DEFAULT_CAP = 32768      # the default context: at most this many tokens...
KV_SHARE = 4             # ...and its KV cache at most 1/KV_SHARE of the free memory
KV_ELEMENT_BYTES = 2     # the KV cache's element (f16, llama.cpp's default type_k / type_v)
FALLBACK_CTX = 4096      # a model whose header does not say its trained length
MIN_CTX = 2048           # little free memory: still at least this (or the model's own length, when shorter)
ROUND = 256              # a capped context is a multiple of this


class Fit(NamedTuple):
    tokens: list[int]                 # the prompt of `messages`
    messages: list[Message]           # what the model reads: the system prompt, then the newest turns that fit
    dropped: int                      # messages left out (the oldest after the system prompt); 0: the whole chat


class Window:
    """One chat's window. It keeps the messages it left out last turn, so the next turn of the same chat starts at
    the same turn (its prompt shares the prefix, whose KV is kept) until the prompt outgrows the context again."""

    def __init__(self) -> None:
        self._left: tuple[Message, ...] = ()

    def reset(self) -> None:
        """A new chat: nothing left out."""
        self._left = ()

    def fit(self, messages: Sequence[Message], tokens: Tokens, n_ctx: int, max_tokens: int) -> Fit:
        """The newest turns of `messages` whose prompt leaves room for a reply in `n_ctx` tokens; EngineError (one
        line) when the question alone, with the system prompt, does not fit."""
        msgs = list(messages)
        head = 0                                   # the leading system prompt(s): always kept
        while head < len(msgs) - 1 and msgs[head].role == "system":
            head += 1
        # where the window may start: the first message after the system prompt, or a question
        starts = [head] + [i for i in range(head + 1, len(msgs)) if msgs[i].role == "user"]
        memo: dict[int, list[int]] = {}

        def prompt(j: int) -> list[int]:
            if j not in memo:
                memo[j] = tokens(msgs[:head] + msgs[starts[j]:])
            return memo[j]

        reserve = max(1, min(max_tokens, n_ctx // REPLY_SHARE))
        first = 0                                  # the same start as last turn while this chat begins as it did
        left = len(self._left)
        if left and tuple(msgs[head:head + left]) == self._left and head + left in starts:
            first = starts.index(head + left)

        def fits(room: int) -> Callable[[int], bool]:
            return lambda j: len(prompt(j)) + room <= n_ctx

        j = _first(first, len(starts), fits(reserve))
        if j is not None and j != first:           # a new cut: room for the next turns too, where there is some
            roomy = _first(j, len(starts), fits(reserve + n_ctx // SLACK_SHARE))
            j = roomy if roomy is not None else j
        if j is None:                              # the question alone: the reply gets whatever room is left
            j = len(starts) - 1
            if len(prompt(j)) + 1 >= n_ctx:
                who = "the system prompt and your message do" if head else "your message does"
                raise EngineError(f"{who} not fit the context ({len(prompt(j))} tokens; it holds {n_ctx}): "
                                  "shorten it, or open the model with a larger --ctx")
        self._left = tuple(msgs[head:starts[j]])
        return Fit(prompt(j), msgs[:head] + msgs[starts[j]:], starts[j] - head)


def _first(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The smallest j in [lo, hi) with ok(j), ok being monotone (later starts: shorter prompts); None if none."""
    if lo >= hi:
        return None
    if ok(lo):                             # (the usual case, one prompt tokenized: the chat fits as it is)
        return lo
    if not ok(hi - 1):
        return None
    while lo < hi - 1:
        mid = (lo + hi - 1) // 2
        if ok(mid):
            hi = mid + 1
        else:
            lo = mid + 1
    return lo


def tokens_of(model: "Model", render: Callable[[Sequence[Message]], str]) -> Tokens:
    """The prompt tokens of a chat as the engine reads it: rendered by `render`, tokenized with special tokens."""
    return lambda ms: model.tokenize(render(ms), add_special=True, parse_special=True)


# -- the default context ----------------------------------------------------------------------------------------


def kv_bytes_per_token(h: ggufhead.Header) -> int:
    """Bytes of KV cache one position takes, from the header: K and V rows of every attention layer (a hybrid
    model's attention layers only: `full_attention_interval`, or per-layer KV head counts of 0). An estimate on the
    high side (sliding-window layers counted in full); 0 when the header does not say."""
    arch = str(h.get("general.architecture", ""))

    def num(key: str) -> int:
        v = h.get(f"{arch}.{key}")
        if v is None and f"{arch}.{key}" in h.arrays:     # a per-layer array: its largest value
            v = max(h.arrays[f"{arch}.{key}"], default=0)
        return int(v) if isinstance(v, (int, float)) else 0

    n_layer, n_embd, n_head = num("block_count"), num("embedding_length"), num("attention.head_count")
    k = num("attention.key_length") or (n_embd // n_head if n_head else 0)
    v = num("attention.value_length") or k
    per_layer = h.arrays.get(f"{arch}.attention.head_count_kv")
    if per_layer and len(per_layer) == n_layer:
        heads = sum(int(x) for x in per_layer)
    else:
        interval = max(1, num("full_attention_interval"))
        heads = n_layer // interval * (num("attention.head_count_kv") or n_head)
    return heads * (k + v) * KV_ELEMENT_BYTES


@dataclasses.dataclass(frozen=True)
class Sized:
    n_ctx: int
    line: str                          # why, when it is less than the model's trained length ("" otherwise)


def default_ctx(h: ggufhead.Header, free: int | None, where: str = "memory") -> Sized:
    """The context to open without --ctx: min(trained length, DEFAULT_CAP), lowered so the KV cache takes at most
    1/KV_SHARE of `free` bytes (`where`: "VRAM" or "RAM"; None: unknown, no cap)."""
    arch = str(h.get("general.architecture", ""))
    trained = h.get(f"{arch}.context_length")
    trained = int(trained) if isinstance(trained, int) and trained > 0 else 0
    n = min(trained, DEFAULT_CAP) if trained else FALLBACK_CTX
    per = kv_bytes_per_token(h)
    if free and per and free // KV_SHARE // per < n:
        n = max(free // KV_SHARE // per // ROUND * ROUND, min(n, MIN_CTX))
        of = f" of the model's {trained}" if trained else ""
        return Sized(n, f"context: {n} tokens{of}, its KV cache ({n * per / hardware.GiB:.1f} GiB) at most a "
                        f"quarter of the free {where} ({free / hardware.GiB:.1f} GiB): --ctx N sets it")
    if trained > n:
        return Sized(n, f"context: {n} of the model's {trained} tokens (the default's cap): --ctx N sets it")
    return Sized(n, "")


def sized_ctx(model: Path, notices: list[str]) -> int:
    """default_ctx for `model` on this machine, measured now (after the model's weights are in): the free VRAM
    of the GPUs (the KV cache lives there when there is one), else the free RAM; its line joins `notices`."""
    try:
        h = ggufhead.read_header(model)
    except ggufhead.HeaderError:
        return FALLBACK_CTX                        # (the model loaded, so this is unlikely)
    gpus = native.gpus()
    free = sum(g.free for g in gpus) if gpus else hardware.mem_available()
    s = default_ctx(h, free, "VRAM" if gpus else "RAM")
    notices += [s.line] if s.line else []
    return s.n_ctx
