"""Checkpoints of recurrent state (gated delta-net, Mamba...), so a chat turn can resume where the last prompt ended.

Recurrent memory holds one state per sequence, not one row per position: it cannot be cut back to an earlier
position (beyond the few snapshots a context keeps for rejected drafts). Each turn re-renders the whole conversation,
so without help every follow-up turn on a hybrid model (qwen35moe) would read the entire chat again. The engine
saves the recurrent part of the state at the end of each prompt (llama.cpp's "partial" sequence state: the
recurrent layers only, a few MiB to ~60 MiB at Qwen3.6-35B-A3B's shape), twice: where the generation prompt begins
(templates may render the assistant's turn differently once it is history: Qwen3.5/3.6 open a `<think>` block in
the generation prompt and drop it from past turns) and at the prompt's end. The next turn restores the latest one
its prompt still shares, cuts the attention KV back to the same position (attention KV can be cut) and reads only
what is new. Where the checkpoint does not fit (an edited message, a shorter prompt) the turn
re-reads from the start and says so.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import TYPE_CHECKING, Sequence

from ..errors import EngineError
from .model import Context

if TYPE_CHECKING:
    from .mtp import MTP

PARTIAL_ONLY = 1      # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the recurrent (or SWA) part of a sequence's state


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    pos: int                          # the state after positions 0..pos-1
    data: "ctypes.Array[ctypes.c_uint8]"

    @property
    def nbytes(self) -> int:
        return len(self.data)


def save(ctx: Context) -> Checkpoint:
    """The recurrent state of seq 0 as it is now (after ctx.n_past positions)."""
    L = ctx._L
    n = L.llama_state_seq_get_size_ext(ctx.ptr, 0, PARTIAL_ONLY)
    buf = (ctypes.c_uint8 * n)()
    got = L.llama_state_seq_get_data_ext(ctx.ptr, buf, n, 0, PARTIAL_ONLY)
    if got != n:
        raise EngineError(f"could not save the recurrent state ({got} of {n} bytes)")
    return Checkpoint(ctx.n_past, buf)


def restore(ctx: Context, ck: Checkpoint) -> None:
    """Back to the state after ck.pos positions: the recurrent part from the checkpoint, the attention KV cut."""
    L = ctx._L
    if L.llama_state_seq_set_data_ext(ctx.ptr, ck.data, ck.nbytes, 0, PARTIAL_ONLY) != ck.nbytes:
        raise EngineError("could not restore the recurrent state checkpoint")
    ctx.n_past = max(ctx.n_past, ck.pos)
    ctx.truncate(ck.pos)              # attention rows >= pos; the recurrent state already ends at pos - 1


def prefill(ctx: Context, toks: Sequence[int], p: int, q: int) -> list[Checkpoint]:
    """Read the prompt from position p: on a recurrent model in two parts, checkpointed where the generation
    prompt begins (`q`, when inside what is read) and at the end; returns the checkpoints (none otherwise)."""
    if not ctx.model.recurrent:
        ctx.decode(toks[p:], prompt=True)
        return []
    ckpts = []
    if p < q < len(toks):
        ctx.decode(toks[p:q], prompt=True)
        ckpts.append(save(ctx))
        p = q
    ctx.decode(toks[p:], prompt=True)
    ckpts.append(save(ctx))
    return ckpts


def keep_prefix(ctx: Context, mtp: "MTP | None", checkpoints: Sequence[Checkpoint], p: int, had: int) -> int:
    """A new turn: cut the context (and the MTP draft's) back to p, the prefix its prompt shares with what they hold
    (`had` positions); returns the position kept: p, or on a recurrent model that cannot cut back the latest of
    the last prompt's `checkpoints` at or before p, or 0 (the prompt is read again from the start)."""
    def cut(q: int) -> None:
        ctx.truncate(q)
        if mtp is not None:
            mtp.truncate(q)

    if p < had and not ctx.can_truncate(p):
        for ck in sorted(checkpoints, key=lambda c: -c.pos):
            if 0 < ck.pos <= p:
                try:
                    restore(ctx, ck)
                    if mtp is not None:
                        mtp.truncate(ck.pos)
                    return ck.pos
                except EngineError:
                    break
        p = 0
    try:
        cut(p)
        return p
    except EngineError:
        if p == 0:
            raise
    cut(0)
    return 0
