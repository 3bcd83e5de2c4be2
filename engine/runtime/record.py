"""Routing recorded from the engine's native stats ring: in a chat (Ctrl+R: Recorder, kept by the Engine), from prompt
files (`moeslots record`: record()), and the what-if line the inspector shows (the simulator on the recent ring).

`moeslots record`: each prompt file is one chat turn: its prompt rows (negative pos) and n decode rows are appended.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ...profiles.simulate import resident_from_plan, simulate, static_hits, token_matrix
from ...profiles.trace import Trace, empty, from_ring, write_csv
from ..api import Message
from ..errors import EngineError
from ..llm.facts import ModelFacts
from ..llm.model import Context, LoadOptions, Model
from ..llm.mtp import sample
from ..llm.template import render_chat
from ..native import routing_stats
from ..native.expert_cache import SlotPlan
from ..native.routing_stats import RoutingStats


class Recorder:
    """The rows of each turn since start (Ctrl+R in the app), written as a profile by stop()."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.tokens = 0                       # decode tokens recorded

    def keep(self, before: RoutingStats, after: RoutingStats, k: int, n_decoded: int, end: int) -> None:
        """The rows one turn wrote (stats.turn_rows: prompt rows of the new prompt part and decode rows)."""
        rows = routing_stats.turn_rows(before, after, k, end)
        if rows is not None:
            self.rows.append(rows)
            self.tokens += n_decoded

    def trace(self, meta: dict[str, str], k: int) -> Trace:
        rows = np.concatenate(self.rows) if self.rows else np.zeros((0, 2 + k), np.int32)
        return from_ring(rows, meta)


def stop_recorder(rec: "Recorder | None", path: Path) -> "Recorder":
    """The recorder to write at `path` when recording stops: refused while it holds no decode token (a profile is
    never replaced with an empty one; recording goes on) or when not recording."""
    if rec is None:
        raise EngineError("not recording")
    if not rec.tokens:
        raise EngineError(f"nothing recorded yet (no decode token since recording began): {path} not written; "
                          "still recording")
    return rec


def routing_meta(f: ModelFacts, n_layer_all: int, tokens: int) -> dict[str, str]:
    """The `# key=value` facts a recorded profile carries (a profile of another model is refused by them)."""
    return {"arch": f.arch, "n_layer": str(n_layer_all), "n_expert": str(f.n_expert), "k": str(f.n_expert_used),
            "model": Path(f.path).name.replace(" ", "_"), "tokens": str(tokens)}


def whatif_line(st: RoutingStats, plan: SlotPlan, n_expert: int, measured: bool = True) -> str | None:
    """The simulator (profiles.simulate) on the recent ring: the hit rate LRU and re-elect-16 would get with the same
    slots, beside the static plan's: measured (the native counters, after a reply), or — `measured` False, a plan
    just applied — the plan simulated on the same ring ("est."). None when there is too little to say (a Python loop
    over tokens: the engine runs it after a reply or a slot change, never on the UI thread)."""
    if not plan.layers:
        return None
    ring = st.ring[st.ring[:, 0] >= 0][-256 * max(1, len(plan.layers)):]
    if len(ring) < 8:
        return None
    slots = plan.slots_per_layer
    try:
        trace = from_ring(ring, {"n_expert": str(n_expert)})
        res = {r.policy: r.hit_rate for r in simulate(trace, slots, ["lru", "reelect-16"])}
        if measured:
            static = f"static {100 * st.hit_rate:.0f} %"
        else:
            layers, P = token_matrix(trace)
            hit = static_hits(P, resident_from_plan(dict(plan.layers), layers, n_expert))[0]
            static = f"static {100 * hit:.0f} % est."
    except ValueError:                                   # (a TraceError too: no token with rows for every layer)
        return None
    return f"what-if @{slots}: {static}  lru {100 * res['lru']:.0f} %  re-elect {100 * res['reelect-16']:.0f} %"


@dataclasses.dataclass
class RecordProgress:
    file: str
    tokens: int
    rows: int


class RecordInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM/SIGHUP, which `moeslots record` turns into one) during a recording: `saved` says whether
    what was recorded went to the output file (not when no decode token was recorded: a profile is never replaced
    by an empty one)."""

    def __init__(self, trace: Trace, saved: bool, cause: BaseException):
        super().__init__(str(cause))
        self.trace, self.saved, self.cause = trace, saved, cause


def record(model_path: Path, prompt_files: Sequence[Path], out: Path, *, n_decode: int = 500,
           threads: int | None = None, n_ctx: int = 4096, temperature: float = 0.0, seed: int = 0,
           progress: Callable[[RecordProgress], None] | None = None) -> Trace:
    """Returns the trace written to `out`. Ctrl-C (KeyboardInterrupt) saves what was recorded, then raises
    RecordInterrupted. Only a trace with decode rows is written: without any (an interrupt before the first decode
    token, replies that end at once) `out` is left as it was (EngineError when not interrupted).
    temperature 0 decodes greedily (what a chat would route); > 0 samples (random-weight models otherwise fall into
    short greedy cycles whose routing repeats)."""
    texts = []
    for prompt_file in prompt_files:
        try:
            texts.append((Path(prompt_file).name, Path(prompt_file).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as e:
            raise EngineError(f"cannot read prompt file {prompt_file}: {e}") from None
    if Path(out).is_dir():
        raise EngineError(f"{out} is a folder: -o takes the profile's file name (e.g. {Path(out) / 'profile.csv'})")
    model = Model(model_path, LoadOptions(experts_on_host=True))
    f = model.facts
    meta = {"arch": f.arch, "n_layer": str(model.n_layer_all), "n_expert": str(f.n_expert),
            "k": str(f.n_expert_used), "model": Path(model_path).name.replace(" ", "_")}
    chunks: list[Trace] = []
    rng = np.random.default_rng(seed)

    n_moe = len([il for il in f.moe_layers if il < f.n_layer])
    total_tokens = 0
    stop: BaseException | None = None
    try:
        with Context(model, n_ctx=n_ctx, n_batch=512, threads=threads) as ctx:
            for name, text in texts:
                prompt = model.tokenize(render_chat(model, [Message("user", text)]))
                if len(prompt) + n_decode + 1 > n_ctx:
                    prompt = prompt[-(n_ctx - n_decode - 1):]       # keep the end: the template's generation prompt
                ctx.enable_stats(ring_rows=(len(prompt) + n_decode) * n_moe + 16)
                ctx.reset()
                try:
                    ctx.decode(prompt, all_logits=True, prompt=True)   # all rows output: the last layer routes them all
                    done = 0
                    for _ in range(n_decode):
                        tok = sample(ctx.logits(), temperature, rng)
                        if model.is_eog(tok) or ctx.n_past + 1 >= n_ctx:
                            break
                        ctx.decode([tok])
                        done += 1
                        if progress and done % 16 == 0:
                            progress(RecordProgress(name, total_tokens + done, sum(c.n_rows for c in chunks)))
                finally:
                    ring = ctx.read_stats().ring
                    chunks.append(from_ring(ring, meta))
                    total_tokens += int((ring[:, 0] >= 0).sum() // max(1, n_moe))
    except BaseException as e:  # Ctrl-C, SIGTERM/SIGHUP, a failed decode: save what was recorded
        stop = e
    try:
        trace = (Trace(np.concatenate([c.pos for c in chunks]), np.concatenate([c.layer for c in chunks]),
                       np.concatenate([c.ids for c in chunks]), {**meta, "tokens": str(total_tokens)})
                 if chunks else empty(f.n_expert_used, meta))
        saved = trace.decode_tokens > 0            # prompt rows alone plan nothing: never replace a profile by them
        if saved:
            write_csv(trace, out)
    finally:
        model.close()
    if isinstance(stop, KeyboardInterrupt):
        raise RecordInterrupted(trace, saved, stop) from stop
    if stop is not None:
        raise stop
    if not saved:
        raise EngineError(f"nothing recorded: no reply got a decode token; {out} "
                          f"{'left as it was' if Path(out).exists() else 'not written'}")
    return trace
