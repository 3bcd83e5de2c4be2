"""The Engine the app talks to (design §4; its types and protocol: engine.api): load, the chat loop with cancel,
slots, immutable snapshots.

One model, one chat context, native routing stats on. `chat()` is a generator meant to run in a worker thread;
`snapshot()` is cheap and safe from any thread (it copies under a lock). Turns reuse the KV cache of the common
prefix with the previous turn, so a reconfigure between turns keeps the chat without re-reading it all. Beside the
loop: slot plans (engine.slots), re-picks and `--repick auto` (engine.residency), recording and the what-if line
(engine.record), the automatic profile (engine.autoprofile).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, Union

import numpy as np

from ...profiles.trace import Trace, write_csv
from ..api import Done, EngineConfig, LayerSnapshot, Message, Sampling, Snapshot, TextDelta, TurnStats
from ..errors import EngineError, refuse_closed
from ..llm import recurrent
from ..llm.model import ENGINE, Context, Detokenizer, LoadOptions, Model, default_threads, track
from ..llm.mtp import MTP, sample
from ..llm.mtp import attach as attach_mtp
from ..llm.template import generation_start, render_chat
from ..machine import autocal, calibrate, discovery, hardware
from ..native import expert_cache, routing_stats
from ..native import lib as native
from ..native.expert_cache import SlotPlan
from . import autoprofile, recent_routing, slot_plans, window, window_stats
from .closing import Closing
from .mtp_auto import AdaptiveMTP
from .record import Recorder, routing_meta, stop_recorder, whatif_line
from .residency import Residency
from .slot_plans import plan_from_profile
from .state import EngineState

if TYPE_CHECKING:
    from ...profiles.costs import CostModel

__all__ = ["Done", "Engine", "EngineConfig", "LayerSnapshot", "Message", "Sampling", "Snapshot", "TextDelta",
           "TurnStats"]


class Engine(Closing):
    """The engine of design §4 (engine.api.Engine): one model, one chat context, native routing stats on."""

    def __init__(self, cfg: EngineConfig, progress: Callable[[str], None] | None = None):
        """progress: each step of long work at load (the first-run calibration; None once the app has the screen)."""
        native.require_patched()
        self.progress_cb, self._progress = progress, ""
        self._clock: Callable[[], float] = time.perf_counter   # the replies' timing (auto's check reads it)
        expert_cache.set_async(cfg.async_cpu)
        self.state = EngineState(cfg)               # config, plan, counters, locks: shared with the parts, one owner
        self._closed = False                        # after close(): every call raises ClosedError (engine.errors)
        self._free_later = False                    # close() timed out waiting for a reply: the reply frees it
        self.notices: list[str] = []                # said once to the user (e.g. "no MTP head")
        track(self, ENGINE)
        load = hardware.resolve_mmap(cfg.mmap, discovery.expert_bytes(cfg.model))
        self.notices.append(load.line)
        self.model = Model(cfg.model, LoadOptions(experts_on_host=True, extra_bufts=not cfg.pack_host,
                                                  use_mmap=load.mmap,
                                                  load_mtp=cfg.mtp, mtp_head_on_gpu=cfg.mtp_head_on_gpu))
        self.mtp: MTP | None = None
        offload, why = calibrate.prompt_path(pinned=not load.mmap)      # prompts: misses streamed or on the CPU
        self.notices += [why] if why else []
        try:
            n_ctx = cfg.n_ctx or window.sized_ctx(cfg.model, self.notices)   # 0: the model's length, memory
            self.ctx = Context(self.model, n_ctx=n_ctx, n_batch=512, threads=cfg.threads, op_offload=offload,
                               rollback=cfg.mtp_draft if cfg.mtp and self.model.mtp_loaded else 0)  # MTP drafts' room
            self.ctx.enable_stats(cfg.stats_ring)
            if cfg.mtp:
                self.mtp = attach_mtp(self.model, self.ctx, cfg.mtp_draft, cfg.threads, self.notices)
        except BaseException:
            self.close()
            raise
        self._tokens: list[int] = []                 # what the KV cache holds
        self._tok_s: deque[float] = deque(maxlen=32)
        self._prompt_tok_s = 0.0
        self._rng = np.random.default_rng(cfg.seed)
        self._turn = (Sampling(cfg.temperature), self._rng)   # this reply's sampling and its draws (chat())
        self.load_line = "expert cache: off"
        self._rec: Recorder | None = None             # routing rows recorded so far (while recording)
        self.counts_window = window_stats.Window(self.model.facts, self.model.n_layer_all)  # the inspector's figures
        self._recent = recent_routing.RecentCounts(self.model.n_layer_all, self.model.facts.n_expert,
                                               self.model.facts.n_expert_used, max(cfg.stats_ring, 0))
        self.mtp_auto = AdaptiveMTP(self.mtp, self._sample) if self.mtp is not None and cfg.mtp_auto else None
        self.residency = Residency(self)                   # re-picks and --repick auto (engine.residency)
        self._reread, self._window = False, window.Window()      # (the turns the model sees: engine.window)
        self._ckpts: list[recurrent.Checkpoint] = []       # recurrent models: states of the last prompt (where its
                                                           # generation prompt began, where it ended)
        self._auto: autoprofile.AutoProfile | None = None
        try:
            self._auto = autoprofile.attach(self) if cfg.auto_profile else None   # may set self.cfg.profile
            if cfg.slots not in (None, 0) and not (self._auto and self._auto.plan_first_prompt):
                self.set_slots(cfg.slots)
                if cfg.slots == "auto":
                    self.notices.append(self.explain_slots())
        except BaseException:
            self.close()
            raise

    # -- slots (engine.slots) -------------------------------------------------------------------------------

    def set_slots(self, plan_or_n: Union[int, str, SlotPlan, None]) -> str:
        """Between generations. On error the previous plan is restored (if it still fits) and the error raised.
        Returns the load line ("auto": and why that many)."""
        refuse_closed(self._closed, "this engine")
        plan = self._resolve_plan(plan_or_n)
        if not self.state.busy.acquire(blocking=False):
            raise EngineError("cannot change slots while generating: stop the reply first")
        try:
            return self.apply_plan(plan) + (f"; {self.explain_slots(auto=True)}" if plan_or_n == "auto" else "")
        finally:
            self.state.busy.release()

    def apply_plan(self, plan: SlotPlan) -> str:
        """set_slots' work, for a caller holding state.busy (autoprofile plans between a prompt and its reply)."""
        old = self.state.plan
        self.residency.drain()
        choice = self.residency.decide(plan)             # the policy for this plan (engine.residency)
        spare = self.residency.may_move()                # overlapped re-picks copy into a spare entry per layer
        try:
            line = self.model.set_slots(plan, pack_host=self.cfg.pack_host, spare=spare)
        except expert_cache.CacheError:
            try:
                self.load_line = self.model.set_slots(old, pack_host=self.cfg.pack_host, spare=spare)
            except expert_cache.CacheError:
                self.state.set_plan(SlotPlan({}))
                self.load_line = "expert cache: off"
            raise
        st = self.ctx.read_stats()      # a new window of figures; its what-if: the new plan on the recent routing
        est = whatif_line(st, plan, self.model.facts.n_expert, measured=False) or ""
        with self.state.lock:
            self.state.set_plan(plan)
            self.load_line = line
            self.residency.plan_applied(plan, spare, choice)
            self.counts_window.mark(st, window_stats.POLICY if plan == old else window_stats.SLOTS,
                                    self.state.upload_bytes, est)
        return line

    def _resolve_plan(self, p: Union[int, str, SlotPlan, None]) -> SlotPlan:
        if p is None or p == 0:
            return SlotPlan({})
        if isinstance(p, SlotPlan):
            return p
        if self.cfg.profile is None:
            raise EngineError(f"--slots {p} needs a profile to choose the experts: record one with "
                              "`moeslots record MODEL --prompt-file F -o P.csv` and pass --profile P.csv")
        return plan_from_profile(self.model, Path(self.cfg.profile), p, pack_host=self.cfg.pack_host,
                                 notices=self.notices, spare=self.residency.may_move())

    def cost_model(self) -> "tuple[CostModel, str]":
        """This machine's calibrated costs for this model (or the defaults), and where they come from."""
        f = self.model.facts
        return calibrate.costs_for(f.slab_bytes, pinned=not self.model.opts.use_mmap, shape=autocal.shape_of(f),
                                   threads=self.cfg.threads or default_threads())

    def say_progress(self, line: str) -> None:
        """A step of long work (the first-run calibration): the snapshot's progress line ("" when done)."""
        with self.state.lock:
            self._progress = line
        if self.progress_cb is not None and line:
            self.progress_cb(line)

    def explain_slots(self, auto: bool = False) -> str:
        """One line on the slot count in use: what fits (auto: why that many), what the active profile predicts."""
        return slot_plans.explain(self.model, self.state.plan, pack_host=self.cfg.pack_host, profile=self.cfg.profile,
                                 costs=self.cost_model, auto=auto)

    def slots_info(self) -> str:
        """One line for the slots dialog: bytes per slot, the pack now, what the free VRAM would hold."""
        return slot_plans.info(self.model, pack_host=self.cfg.pack_host)

    @property
    def cfg(self) -> EngineConfig:
        """The configuration in force (engine.state: re-picks, F3 and the automatic profile change it there)."""
        return self.state.cfg

    @property
    def profile(self) -> Path | None:
        """The profile the slots are planned from (given, or the automatic profile's once saved)."""
        return self.cfg.profile

    def use_profile(self, path: Path) -> None:
        """Take another profile for the next set_slots (checked against this model there)."""
        self.state.configure(profile=Path(path))

    def profile_overlap(self, path: Path) -> float | None:
        """Mean per-layer overlap of the top-S sets of `path` and the active profile at the current S."""
        return slot_plans.profile_overlap(self.model, self.state.plan, self.cfg.profile, Path(path))

    # -- residency (engine.residency) -------------------------------------------------------------------------

    def set_repick(self, every: int, swaps: int | None = None, *, auto: bool = False) -> str:
        """Re-pick every `every` decode tokens (0: static); ends `--repick auto`'s decisions unless auto."""
        refuse_closed(self._closed, "this engine")
        return self.residency.set_repick(every, swaps, auto=auto)

    def set_repick_auto(self, cost: "CostModel | None" = None) -> str:
        """`--repick auto`: the interval from the active profile under this machine's costs; the reason."""
        return self.residency.set_auto(cost)

    # -- chat ------------------------------------------------------------------------------------------------

    def render_prompt(self, messages: Sequence[Message]) -> str:
        refuse_closed(self._closed, "this engine")     # (the template is read from the freed model)
        return render_chat(self.model, messages)

    def chat(self, messages: Sequence[Message], cancel: threading.Event | None = None,
             sampling: Sampling | None = None, *, max_tokens: int | None = None) -> Iterator[Union[TextDelta, Done]]:
        """A reply, streamed. sampling: this reply's (None: greedy, or EngineConfig.temperature)."""
        refuse_closed(self._closed, "this engine")
        s = sampling or Sampling(self.cfg.temperature)
        if s.problem():
            raise EngineError(f"sampling: {s.problem()}")
        if not self.state.busy.acquire(blocking=False):
            raise EngineError("a reply is already being generated")
        try:
            with self.state.lock:
                self.state.set_generating(True)
            self._turn = (s, self._rng if s.seed is None else np.random.default_rng(s.seed))
            yield from self._chat(messages, cancel or threading.Event(), max_tokens or self.cfg.max_tokens)
        finally:
            with self.state.lock:
                self.state.set_generating(False)
                self.residency.generation_ended()
            self.state.busy.release()
            self._free_if_left()                       # closed while this reply ran past close()'s wait

    def _chat(self, messages: Sequence[Message], cancel: threading.Event,
              max_tokens: int) -> Iterator[Union[TextDelta, Done]]:
        m, ctx = self.model, self.ctx
        self.residency.before_reply()                      # (auto's check: the runner-up, or back, from here)
        toks, messages, dropped = self._window.fit(messages, window.tokens_of(m, self.render_prompt), ctx.n_ctx,
                                                   max_tokens)     # a full context: the oldest turns leave it
        # reuse the KV of the common prefix; recurrent memory cannot be cut back that far: re-read the prompt
        p = 0
        while p < min(len(toks) - 1, len(self._tokens)) and toks[p] == self._tokens[p]:
            p += 1
        had = len(self._tokens)
        self._tokens = []                                # until the prompt is in: a failed turn leaves no stale KV
        p = recurrent.keep_prefix(self.ctx, self.mtp, self._ckpts, p, had)
        reread = p == 0 and had > 0
        self._tokens = toks[:p]
        with self.state.lock:
            self._reread = reread
        st_before = ctx.read_stats() if self._rec is not None or self._auto is not None else None
        t0 = self._clock()
        q = generation_start(m, messages, toks) if m.recurrent else len(toks)
        self._ckpts = recurrent.prefill(ctx, toks, p, q)   # a recurrent model's next turn resumes from these
        self._tokens = list(toks)
        if self.mtp is not None:
            self.mtp.feed(self._tokens, ctx.n_past)    # the draft's prompt rows count as prompt work
        if self._auto is not None:
            self._auto.after_prefill(self)             # no profile yet: this prompt's routing plans the slots
        t1 = self._clock()
        st0 = ctx.read_stats()
        b0 = routing_stats.weight_copy_bytes()
        det = Detokenizer(m)
        text: list[str] = []
        n = 0
        cancelled = False
        x = self._sample(ctx.logits())
        while n < max_tokens:
            if cancel.is_set():
                cancelled = True
                break
            refuse_closed(self._closed, "this engine")    # close() meanwhile: this reply stops (a flag per token)
            if m.is_eog(x) or ctx.n_past + 2 + (self.mtp.n_draft if self.mtp else 0) >= ctx.n_ctx:
                break
            if self.mtp is not None:
                s, rng = self._turn
                emitted = (self.mtp_auto or self.mtp).step(self._tokens, x, s.temperature, rng, s.top_p)
                new, x = emitted[:-1], emitted[-1]
            else:
                ctx.decode([x])
                self._tokens.append(x)
                new, x = [x], self._sample(ctx.logits())
            self.residency.step(len(new))
            stop = False
            for tok in new:                                     # MTP may emit past an end token or the limit
                if m.is_eog(tok) or n >= max_tokens:
                    stop = True
                    break
                n += 1
                piece = det.push(tok)
                if piece:
                    text.append(piece)
                    yield TextDelta(piece)
            if stop:
                break
        rest = det.flush()
        if rest:
            text.append(rest)
            yield TextDelta(rest)
        t2 = self._clock()
        st1 = ctx.read_stats()
        if st_before is not None:
            with self.state.lock:
                if self._rec is not None:                       # (still) recording
                    self._rec.keep(st_before, st1, m.facts.n_expert_used, n, end=len(toks) + n)
        if self._auto is not None and st_before is not None:
            self._auto.after_reply(self, st_before, st1, n, end=len(toks) + n)   # saved in the background
        if n:
            self.counts_window.after_reply(st1, self.state.plan)  # what-if line: here, not in snapshot() (UI thread)
            self.residency.after_reply(st1, self.state.decode_tokens + n, n, t2 - t1)
        hits = int(st1.hits.sum() - st0.hits.sum())
        miss = int(st1.misses.sum() - st0.misses.sum())
        with self.state.lock:
            if n:
                self._tok_s.append(n / (t2 - t1))
            self._prompt_tok_s = (len(toks) - p) / (t1 - t0) if t1 > t0 else 0.0
            self.state.add_decoded(n)
            self.state.add_uploads(routing_stats.weight_copy_bytes() - b0)
        yield Done(TurnStats(len(toks) - p, t1 - t0, n, t2 - t1, cancelled,
                             hits / (hits + miss) if hits + miss else 0.0, reread, dropped, ctx.n_ctx), "".join(text))

    def _sample(self, logits: np.ndarray) -> int:
        s, rng = self._turn
        return sample(logits, s, rng, recent=self._tokens, mtp=self.mtp)   # the penalty reads the tokens so far

    def new_chat(self) -> None:
        refuse_closed(self._closed, "this engine")
        with self.state.busy:
            self.ctx.reset()
            if self.mtp is not None:
                self.mtp.truncate(0)
            self._tokens = []
            self._ckpts = []
            self._window.reset()

    def start_recording(self) -> None:
        refuse_closed(self._closed, "this engine")
        with self.state.lock:
            self._rec = Recorder()

    @property
    def recording(self) -> bool:
        return self._rec is not None

    @property
    def recorded_tokens(self) -> int:
        return rec.tokens if (rec := self._rec) is not None else 0

    def stop_recording(self, path: Path) -> Trace:
        """Write what was recorded (atomically) and stop; returns the trace."""
        refuse_closed(self._closed, "this engine")
        with self.state.lock:
            rec = stop_recorder(self._rec, path)        # (an empty recording is refused and goes on)
            self._rec = None
        t = rec.trace(self.routing_meta(rec.tokens), self.model.facts.n_expert_used)
        write_csv(t, Path(path))
        return t

    def routing_meta(self, tokens: int) -> dict[str, str]:
        """The `# key=value` facts a recorded profile carries (a profile of another model is refused by them)."""
        return routing_meta(self.model.facts, self.model.n_layer_all, tokens)

    # -- snapshot --------------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        refuse_closed(self._closed, "this engine")
        with self.state.lock:
            plan, f, ptr, res = self.state.plan, self.model.facts, self.ctx.ptr, self.residency
            st = self._recent.update(lambda rows: routing_stats.read(ptr, self.model.n_layer_all, f.n_expert,
                                                                 f.n_expert_used, rows))   # the new rows only
            w = self.counts_window.figures(st, self.state.upload_bytes)   # every routing figure: since the last change
            layers = [LayerSnapshot(*v) for v in w.layer_views(self._recent.counts, plan.slots_of)]
            fields = res.snapshot_fields(w)
            return Snapshot(
                whatif=w.whatif, model_name=f.name, load_line=self.load_line, layers=tuple(layers),
                gpu_share=w.gpu_share, upload_mb_per_token=w.upload_mb_per_token, window_since=w.since,
                window_tokens=w.tokens, tok_s_last=self._tok_s[-1] if self._tok_s else 0.0,
                tok_s_rolling=tuple(self._tok_s), prompt_tok_s=self._prompt_tok_s,
                mtp_drafted=self.mtp.stats.drafted if self.mtp else 0,
                mtp_accepted=self.mtp.stats.accepted if self.mtp else 0,
                mtp_line=self.mtp_auto.line() if self.mtp_auto else ("MTP on (always)" if self.mtp else ""),
                pack_bytes=expert_cache.pack_bytes(self.model.ptr), recording=self._rec is not None,
                generating=self.state.generating, repicks=res.repicks, repick_swaps=res.swaps,
                repick_mb=res.bytes / 1e6, repick_every=self.cfg.repick_every, repick_auto=res.auto_line,
                reread=self._reread, n_expert=f.n_expert, progress=self._progress, **fields)
