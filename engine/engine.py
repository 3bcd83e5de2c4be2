"""The Engine the app talks to (design §4): load, chat generation with cancel, slots, immutable snapshots.

One model, one chat context, native routing stats on. `chat()` is a generator meant to run in a worker thread;
`snapshot()` is cheap and safe from any thread (it copies under a lock). Turns reuse the KV cache of the common
prefix with the previous turn, so a reconfigure between turns keeps the chat without re-reading it all.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence, Union

import numpy as np

from . import autoprofile, discovery, hardware
from . import cache as cache_mod
from . import model as model_mod
from . import native, recurrent
from . import recent as recent_mod
from . import stats as stats_mod
from .cache import SlotPlan
from .errors import EngineError
from .model import Context, Detokenizer, LoadOptions, Model
from .mtp import MTP, sample
from .mtp_auto import AdaptiveMTP

if TYPE_CHECKING:
    from ..profiles.simulate import CostModel
    from ..profiles.trace import Trace


AUTO_EVERY = 256   # `--repick auto` decides again after this many decode tokens of the chat: the intervals it can
                   # choose (1, 16, 100) each fire at least twice in them, and it is short enough to follow a topic
                   # (every 64 flapped, every 512 reacted late in simulation: docs/benchmarks.md, third session)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    model: Path
    n_ctx: int = 4096
    slots: Union[int, str, SlotPlan, None] = 0      # n per layer or "auto" (both need a profile), a plan, 0/None
    profile: Path | None = None
    mtp: bool = True                                # MTP drafts when the model has a NextN block
    mtp_draft: int = 1                              # draft length
    mtp_auto: bool = True                           # drafting off while acceptance < measured break-even (mtp_auto)
    mtp_head_on_gpu: bool = True                    # the NextN block's experts on the GPU (else host, no slots):
                                                    # the fastest placement on the H200 box (docs/benchmarks.md)
    threads: int | None = None
    pack_host: bool = False                         # hot packs in host memory (tests / CPU-only)
    mmap: Union[bool, str] = "auto"                 # experts mmap'ed (pageable); False: read into pinned host
                                                    # memory — prompts ~5x faster on the H200 box, RAM held;
                                                    # "auto": pinned when free RAM holds them (engine.hardware)
    auto_profile: bool = False                      # no profile given: plan from the first prompt, record and
                                                    # save one per model, use it next time (engine.autoprofile)
    async_cpu: bool = False                         # host chain overlaps the GPU chain (patch 0008; process-wide;
                                                    # off by default: no gain on the H200 box, docs/benchmarks.md)
    stats_ring: int = 1 << 16                       # routing rows kept (recording reads each turn's rows from it)
    repick_every: int = 0                           # re-pick residents every N decode tokens (0: static cache)
    repick_swaps: int = 4                           # at most M swaps per layer per re-pick
    repick_window: int = 64                         # decode tokens whose routing elects the residents
    repick_margin: float = 0.25                     # a candidate must beat the incumbent by this much (hysteresis)
    repick_overlap: bool = True                     # re-pick copies on a worker thread while decoding (patch 0011:
                                                    # one spare pack entry per layer when re-picking at load)
    repick_auto_every: int = 0                      # after set_repick_auto: decide again every N decode tokens from
                                                    # this session's routing (0: the load-time decision stands)
    temperature: float = 0.0
    max_tokens: int = 512
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclasses.dataclass(frozen=True)
class TextDelta:
    text: str


@dataclasses.dataclass(frozen=True)
class TurnStats:
    prompt_tokens: int
    prompt_seconds: float
    tokens: int
    seconds: float
    cancelled: bool
    hit_rate: float
    reread: bool = False                  # the prompt was read again from the start (recurrent memory: no cut-back)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def prompt_tok_s(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Done:
    stats: TurnStats
    text: str


@dataclasses.dataclass(frozen=True)
class LayerSnapshot:
    layer: int
    slot_experts: tuple[int, ...]         # slot -> expert id
    slot_hits_recent: tuple[int, ...]     # per slot, picks in the recent ring window
    slot_hits_total: tuple[int, ...]      # per slot, decode picks since the stats reset
    gpu_share: float                      # hits / decode picks of this layer
    recent_miss_share: float


@dataclasses.dataclass(frozen=True)
class Snapshot:
    model_name: str
    load_line: str
    layers: tuple[LayerSnapshot, ...]
    gpu_share: float                      # share of decode expert picks served from slots
    cpu_experts_per_token: float          # expert evaluations per decode token computed in host memory
    upload_mb_per_token: float            # weight MB crossing to the GPU per decode token (0 for a static cache)
    tok_s_last: float
    tok_s_rolling: tuple[float, ...]      # recent turns' tok/s, oldest first
    prompt_tok_s: float
    mtp_drafted: int
    mtp_accepted: int
    pack_bytes: int
    recording: bool
    generating: bool
    whatif: str = ""                      # hit % the same slots would get with LRU / re-elect on the recent window
    repicks: int = 0                      # adaptive residency: re-picks done, slabs swapped, MB moved in all
    repick_swaps: int = 0
    repick_mb: float = 0.0
    repick_every: int = 0                 # the interval in force (0: static)
    repick_auto: str = ""                 # `--repick auto`: its last decision and why ("" when not on auto)
    reread: bool = False                  # the last turn re-read the whole prompt (its prefix could not be kept)
    mtp_line: str = ""                    # MTP drafting on/off and why (engine.mtp_auto), "" without MTP


def plan_from_profile(model: Model, profile: Path, slots: Union[int, str], *, pack_host: bool = False,
                      notices: list[str] | None = None) -> SlotPlan:
    """Per trunk MoE layer the top-`slots` decode experts of the profile; "auto": the most slots whose packs fit the
    GPU's free memory minus 1 GiB. A profile of another model is refused naming both shapes; one without decode rows
    says so in `notices` (engine.profilecheck)."""
    from .profilecheck import read_for
    from ..profiles.plan import plan_from_counts
    from ..profiles.profile import from_trace

    f = model.facts
    counts = from_trace(read_for(model, profile, notices), model.n_layer_all, f.n_expert).counts
    return SlotPlan(plan_from_counts(counts, slot_count(model, slots, pack_host=pack_host),
                                     [il for il in f.moe_layers if il < f.n_layer]))


def slot_count(model: Model, slots: Union[int, str], *, pack_host: bool = False) -> int:
    """Slots per layer for a plan: a number (checked), or "auto": the most whose packs fit the GPU's free memory
    minus 1 GiB (half the experts with packs in host memory)."""
    from ..profiles.plan import auto_slots

    f = model.facts
    if slots == "auto":
        if pack_host:
            return f.n_expert // 2
        gpus = native.gpus()
        if not gpus:
            raise EngineError("--slots auto: no GPU, so no slots (experts run on the CPU)")
        return auto_slots(max(g.free for g in gpus), len([il for il in f.moe_layers if il < f.n_layer]),
                          f.slab_bytes, f.n_expert)
    try:
        n = int(slots)
    except ValueError:
        raise EngineError(f"--slots takes a number or 'auto', not {slots!r}") from None
    if not 0 <= n <= f.n_expert:
        raise EngineError(f"--slots {n}: the model has {f.n_expert} experts per layer")
    return n


def render_chat(model: Model, messages: Sequence[Message]) -> str:
    """The model's own chat template (Jinja, from the GGUF), with the generation prompt appended."""
    import jinja2

    tmpl = native.llama().llama_model_chat_template(model.ptr, None)
    if not tmpl:
        return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant: "
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    try:
        return env.from_string(tmpl.decode("utf-8", "replace")).render(
            messages=[{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - a damaged or unsupported template is the file's fault: one line
        raise EngineError(f"the model's chat template (tokenizer.chat_template) cannot be used: "
                          f"{type(e).__name__}: {e}") from None


class Engine:
    def __init__(self, cfg: EngineConfig):
        native.require_patched()
        self.cfg = cfg
        cache_mod.set_async(cfg.async_cpu)
        self._lock = threading.RLock()
        self._busy = threading.Lock()
        self.notices: list[str] = []                # said once to the user (e.g. "no MTP head")
        model_mod.track(self, model_mod.ENGINE)
        load = hardware.resolve_mmap(cfg.mmap, discovery.expert_bytes(cfg.model))
        self.notices.append(load.line)
        self.model = Model(cfg.model, LoadOptions(experts_on_host=True, extra_bufts=not cfg.pack_host,
                                                  use_mmap=load.mmap,
                                                  load_mtp=cfg.mtp, mtp_head_on_gpu=cfg.mtp_head_on_gpu))
        self.mtp: MTP | None = None
        try:
            self.ctx = Context(self.model, n_ctx=cfg.n_ctx, n_batch=512, threads=cfg.threads,
                               rollback=cfg.mtp_draft if cfg.mtp else 0)   # rejected drafts of recurrent models
            self.ctx.enable_stats(cfg.stats_ring)
            f = self.model.facts
            if cfg.mtp and f.n_nextn and not f.nextn_tensors:
                self.notices.append(f"{f.name} declares a NextN (MTP) block but the file carries none of its "
                                    "tensors: decoding without MTP")
            elif cfg.mtp and not self.model.mtp_loaded:
                self.notices.append(f"{f.name} has no NextN (MTP) block: decoding without MTP")
            elif cfg.mtp:
                self.mtp = MTP(self.model, self.ctx, n_draft=cfg.mtp_draft, threads=cfg.threads)
        except BaseException:
            self.close()
            raise
        self._tokens: list[int] = []                 # what the KV cache holds
        self._plan = SlotPlan({})
        self._tok_s: deque[float] = deque(maxlen=32)
        self._prompt_tok_s = 0.0
        self._decode_tokens = 0
        self._upload_bytes = 0
        self._generating = False
        self._rng = np.random.default_rng(cfg.seed)
        self.load_line = "expert cache: off"
        self._rec: list[np.ndarray] | None = None   # routing rows recorded so far (while recording)
        self._whatif = ("", -1)                     # (line, decode tokens it was computed at)
        self._recent = recent_mod.RecentCounts(self.model.n_layer_all, self.model.facts.n_expert,
                                               self.model.facts.n_expert_used, max(cfg.stats_ring, 0))
        self.mtp_auto = AdaptiveMTP(self.mtp, self._sample) if self.mtp is not None and cfg.mtp_auto else None
        self._since_repick = 0
        self._repicks = self._repick_swaps = self._repick_bytes = 0
        self._auto_line = ""                               # --repick auto: the last decision, for the snapshot
        self._auto_mark: tuple[int, SlotPlan] | None = None  # live auto: (decode tokens, plan) when last decided
        self._spare = False                                # the packs have a spare entry (overlapped re-picks)
        self._stager: cache_mod.Stager | None = None      # overlapped re-pick copies (created on first use)
        self._rec_tokens = 0
        self._reread = False
        self._ckpt: recurrent.Checkpoint | None = None   # recurrent models: the state where the last prompt ended
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

    # -- slots -----------------------------------------------------------------------------------------------

    def set_slots(self, plan_or_n: Union[int, str, SlotPlan, None]) -> str:
        """Between generations. On error the previous plan is restored (if it still fits) and the error raised."""
        plan = self._resolve_plan(plan_or_n)
        if not self._busy.acquire(blocking=False):
            raise EngineError("cannot change slots while generating: stop the reply first")
        try:
            return self._apply_plan(plan)
        finally:
            self._busy.release()

    def _apply_plan(self, plan: SlotPlan) -> str:
        """set_slots' work, for a caller holding _busy (autoprofile plans between a prompt and its reply)."""
        old = self._plan
        self._drain_stage()
        spare = self.cfg.repick_overlap and self.cfg.repick_every > 0
        try:
            line = self.model.set_slots(plan, pack_host=self.cfg.pack_host, spare=spare)
        except cache_mod.CacheError:
            try:
                self.load_line = self.model.set_slots(old, pack_host=self.cfg.pack_host, spare=spare)
            except cache_mod.CacheError:
                self._plan, self.load_line = SlotPlan({}), "expert cache: off"
            raise
        with self._lock:
            self._plan, self.load_line, self._spare = plan, line, spare
            if self._auto_mark is not None:
                self._auto_mark = (self._decode_tokens, plan)     # live auto scores from the new plan on
        return line

    def cost_model(self) -> "tuple[CostModel, str]":
        """This machine's calibrated costs for this model (or the H200 box defaults), and where they come from."""
        from . import calibrate
        from ..profiles.simulate import CostModel

        slab_mb = self.model.facts.slab_bytes / 1e6 or CostModel.slab_mb
        cal = calibrate.load()
        pinned = not self.model.opts.use_mmap
        if cal is None:
            # the H200 box's uploads as measured by two calibrations on 2026-12-03 (docs/benchmarks.md): pinned
            # 25.6-26.8 GB/s, pageable (mmap) 5.3-6.7 GB/s; the lower of each, so an uncalibrated guess errs static
            pcie = 25.6 if pinned else 5.3
            return (CostModel(slab_mb=slab_mb, pcie_gbps=pcie),
                    f"default costs (H200 box, {'pinned' if pinned else 'pageable (mmap)'} uploads at {pcie} GB/s): "
                    "run `moeslots doctor --calibrate MODEL` for this machine's")
        cost = cal.cost_model(slab_mb, pinned=pinned)
        return cost, (f"costs calibrated on this machine {cal.date}, "
                      f"{'pinned' if pinned else 'pageable (mmap)'} uploads at {cost.pcie_gbps:.1f} GB/s")

    def explain_slots(self) -> str:
        """One line on the slot count in use: what fits, and what the active profile predicts for it."""
        from ..profiles.simulate import simulate
        from ..profiles.trace import TraceError, read_csv

        s = self._plan.slots_per_layer
        f = self.model.facts
        b = cache_mod.pack_bytes(self.model.ptr)
        size = f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"
        where = f"host memory (no GPU), {size}" if self.cfg.pack_host else f"{size} of VRAM"
        line = f"slots: {s} of {f.n_expert} per layer in {where}"
        if self.cfg.profile is None or not s:
            return line
        cost, source = self.cost_model()
        try:
            r = simulate(read_csv(Path(self.cfg.profile)), s, ["static-profile"], cost=cost)[0]
        except (TraceError, ValueError):
            return line
        return (f"{line}; the profile predicts {100 * r.hit_rate:.0f} % of picks served from slots, est. "
                f"{r.ms_per_token:.1f} ms/token [{source}]")

    def _resolve_plan(self, p: Union[int, str, SlotPlan, None]) -> SlotPlan:
        if p is None or p == 0:
            return SlotPlan({})
        if isinstance(p, SlotPlan):
            return p
        if self.cfg.profile is None:
            raise EngineError(f"--slots {p} needs a profile to choose the experts: record one with "
                              "`moeslots record MODEL --prompt-file F -o P.csv` and pass --profile P.csv")
        return plan_from_profile(self.model, Path(self.cfg.profile), p, pack_host=self.cfg.pack_host,
                                 notices=self.notices)

    # -- chat ------------------------------------------------------------------------------------------------

    def render_prompt(self, messages: Sequence[Message]) -> str:
        return render_chat(self.model, messages)

    def chat(self, messages: Sequence[Message], cancel: threading.Event | None = None,
             max_tokens: int | None = None) -> Iterator[Union[TextDelta, Done]]:
        if not self._busy.acquire(blocking=False):
            raise EngineError("a reply is already being generated")
        try:
            with self._lock:
                self._generating = True
            yield from self._chat(messages, cancel or threading.Event(), max_tokens or self.cfg.max_tokens)
        finally:
            with self._lock:
                self._generating = False
            self._busy.release()

    def _chat(self, messages: Sequence[Message], cancel: threading.Event,
              max_tokens: int) -> Iterator[Union[TextDelta, Done]]:
        m, ctx = self.model, self.ctx
        toks = m.tokenize(self.render_prompt(messages), add_special=True, parse_special=True)
        if len(toks) + 1 >= ctx.n_ctx:
            raise EngineError(f"the conversation ({len(toks)} tokens) does not fit the context ({ctx.n_ctx}): "
                              "start a new chat")
        # reuse the KV of the common prefix; recurrent memory cannot be cut back that far: re-read the prompt
        p = 0
        while p < min(len(toks) - 1, len(self._tokens)) and toks[p] == self._tokens[p]:
            p += 1
        had = len(self._tokens)
        self._tokens = []                                # until the prompt is in: a failed turn leaves no stale KV
        p = self._keep_prefix(p, had)
        reread = p == 0 and had > 0
        self._tokens = toks[:p]
        with self._lock:
            self._reread = reread
        st_before = ctx.read_stats() if self._rec is not None or self._auto is not None else None
        t0 = time.perf_counter()
        ctx.decode(toks[p:], prompt=True)
        self._tokens = list(toks)
        if self.model.recurrent:
            self._ckpt = recurrent.save(ctx)           # the next turn resumes here (its prompt starts with this one)
        if self.mtp is not None:
            self.mtp.feed(self._tokens, ctx.n_past)    # the draft's prompt rows count as prompt work
        if self._auto is not None:
            self._auto.after_prefill(self)             # no profile yet: this prompt's routing plans the slots
        t1 = time.perf_counter()
        st0 = ctx.read_stats()
        b0 = stats_mod.weight_copy_bytes()
        det = Detokenizer(m)
        text: list[str] = []
        n = 0
        cancelled = False
        x = self._sample(ctx.logits())
        while n < max_tokens:
            if cancel.is_set():
                cancelled = True
                break
            if m.is_eog(x) or ctx.n_past + 2 + (self.mtp.n_draft if self.mtp else 0) >= ctx.n_ctx:
                break
            if self.mtp is not None:
                emitted = (self.mtp_auto or self.mtp).step(self._tokens, x, self.cfg.temperature, self._rng)
                new, x = emitted[:-1], emitted[-1]
            else:
                ctx.decode([x])
                self._tokens.append(x)
                new, x = [x], self._sample(ctx.logits())
            self._maybe_repick(len(new))
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
        t2 = time.perf_counter()
        st1 = ctx.read_stats()
        if self._rec is not None and st_before is not None:
            self._keep_recorded_rows(st_before, st1, n, end=len(toks) + n)
        if self._auto is not None and st_before is not None:
            self._auto.after_reply(self, st_before, st1, n, end=len(toks) + n)   # saved in the background
        if n:
            self._update_whatif(st1, self._plan, self._decode_tokens + n)   # here, not in snapshot(): the UI thread
            self._maybe_redecide(st1, self._decode_tokens + n)
        hits = int(st1.hits.sum() - st0.hits.sum())
        miss = int(st1.misses.sum() - st0.misses.sum())
        with self._lock:
            if n:
                self._tok_s.append(n / (t2 - t1))
            self._prompt_tok_s = (len(toks) - p) / (t1 - t0) if t1 > t0 else 0.0
            self._decode_tokens += n
            self._upload_bytes += stats_mod.weight_copy_bytes() - b0
        yield Done(TurnStats(len(toks) - p, t1 - t0, n, t2 - t1, cancelled,
                             hits / (hits + miss) if hits + miss else 0.0, reread), "".join(text))

    def _keep_prefix(self, p: int, had: int) -> int:
        """Cut both contexts back to p, the prefix this prompt shares with what they hold (`had` positions); returns
        the position kept: p, or on a recurrent model that cannot cut that far the last prompt's checkpoint
        (engine.recurrent), or 0 (the prompt is read again from the start)."""
        ck = self._ckpt
        if p < had and not self.ctx.can_truncate(p):
            if ck is not None and 0 < ck.pos <= p:
                try:
                    recurrent.restore(self.ctx, ck)
                    if self.mtp is not None:
                        self.mtp.truncate(ck.pos)
                    return ck.pos
                except EngineError:
                    pass
            p = 0
        try:
            self._cut(p)
            return p
        except EngineError:
            if p == 0:
                raise
        self._cut(0)
        return 0

    def _cut(self, p: int) -> None:
        self.ctx.truncate(p)
        if self.mtp is not None:
            self.mtp.truncate(p)

    def _sample(self, logits: np.ndarray) -> int:
        return sample(logits, self.cfg.temperature, self._rng)

    def new_chat(self) -> None:
        with self._busy:
            self.ctx.reset()
            if self.mtp is not None:
                self.mtp.truncate(0)
            self._tokens = []
            self._ckpt = None

    def set_repick(self, every: int, swaps: int | None = None, *, auto: bool = False) -> str:
        """Turn adaptive residency on (re-pick every `every` decode tokens) or off (0); effective from the next
        token. A choice made here (auto=False) ends `--repick auto`'s live decisions. Returns a line for the user."""
        if every < 0:
            raise EngineError("re-pick interval must be >= 0")
        with self._lock:                          # the app's thread (F3) and the generating one (live auto)
            self.cfg = dataclasses.replace(self.cfg, repick_every=every,
                                           repick_swaps=self.cfg.repick_swaps if swaps is None else swaps)
            self._since_repick = 0
            was_auto = bool(self._auto_line)
            if not auto:
                self._auto_mark, self._auto_line = None, ""
        return ((f"re-pick every {every} tokens, at most {self.cfg.repick_swaps} swaps per layer" if every
                 else "static residency (no re-picks)") + (" (re-pick auto off)" if was_auto and not auto else ""))

    def set_repick_auto(self, cost: "CostModel | None" = None) -> str:
        """Choose the re-pick interval by simulating the active profile's trace at the current slots under a cost
        model (default: the H200 box's measured rates); returns the one-line reason."""
        from ..profiles.simulate import choose_repick
        from ..profiles.trace import TraceError, read_csv

        if self.cfg.profile is None or not self._plan.layers:
            raise EngineError("--repick auto needs a profile and slots")
        slots = self._plan.slots_per_layer
        source = "given costs"
        if cost is None:
            cost, source = self.cost_model()
        try:
            n, why = choose_repick(read_csv(Path(self.cfg.profile)), slots, cost,
                                   max_swaps=self.cfg.repick_swaps, margin=self.cfg.repick_margin)
        except (TraceError, ValueError) as e:
            raise EngineError(f"--repick auto: {e}") from None
        self.set_repick(n, auto=True)
        line = f"{why} [{source}]"
        live = self.cfg.repick_auto_every > 0
        with self._lock:
            self._auto_line = f"auto: {line}"
            self._auto_mark = (self._decode_tokens, self._plan) if live else None
        return line + (f"; decided again every {self.cfg.repick_auto_every} tokens from this chat's own routing"
                       if live else "")

    def _maybe_redecide(self, st: "stats_mod.RoutingStats", n_dec: int) -> None:
        """Live `--repick auto` (cfg.repick_auto_every > 0), after a reply: once that many decode tokens have passed
        since the last decision, score static and each interval on them, from the plan held when they began
        (profiles.simulate.choose_repick_from), and switch if another interval wins. A profile recorded earlier
        cannot see the drift of this chat; these tokens can."""
        mark, every = self._auto_mark, self.cfg.repick_auto_every
        if mark is None or every <= 0 or n_dec - mark[0] < every or not self._plan.layers:
            return
        from ..profiles.simulate import choose_repick_from
        from ..profiles.trace import from_ring

        # decode rows of the slot layers (not the NextN block's, whose experts never sit in slots)
        ring = st.ring[(st.ring[:, 0] >= 0) & np.isin(st.ring[:, 1], list(mark[1].layers))]
        was = self.cfg.repick_every
        try:
            cost, _ = self.cost_model()
            n, why = choose_repick_from(from_ring(ring, {"n_expert": str(self.model.facts.n_expert)}),
                                        mark[1].layers, cost, last=n_dec - mark[0], current=was, whole=True,
                                        max_swaps=self.cfg.repick_swaps, margin=self.cfg.repick_margin)
        except Exception as e:  # noqa: BLE001 - a short ring, a calibration edited mid-chat: never end the reply
            n, why = was, f"kept ({e}); decides again on the next {every} tokens"
        with self._lock:
            if self._auto_mark is not mark:
                return                          # F3 or a slot change while deciding: the user's choice stands
            if n != was:
                self.set_repick(n, auto=True)
            self._auto_mark = (n_dec, self._plan)
            self._auto_line = (f"auto @{n_dec} tokens: {why}" if n == was
                               else f"auto @{n_dec} tokens, {'static' if not was else f'every {was}'} -> {why}")

    def _maybe_repick(self, n_new: int) -> None:
        """Adaptive residency (cfg.repick_every > 0): every N decode tokens, elect residents per layer from the
        recent window's picks (profiles.plan.elect, the simulator's rule) and copy only the swapped slabs."""
        if self._stager is not None:
            self._commit_stage()                                   # between decodes: the copies that are in
        n = self.cfg.repick_every
        if n <= 0 or not self._plan.layers:
            return
        self._since_repick += n_new
        if self._since_repick < n:
            return
        self._since_repick = 0
        if self._spare and self.cfg.repick_overlap:
            if self._stager is None:
                self._stager = cache_mod.Stager(self.model.ptr)
            if self._stager.busy:
                return                                             # the last re-pick's copies are still coming in
            swaps_of = cache_mod.elect_swaps(self._plan, self.ctx.read_stats().ring, self.model.facts.n_expert,
                                             max_swaps=self.cfg.repick_swaps, window=self.cfg.repick_window,
                                             margin=self.cfg.repick_margin)
            if swaps_of:
                with self._lock:
                    self._repicks += 1
                self._stager.begin(swaps_of)
            return
        plan, swaps, moved = cache_mod.repick(self.model.ptr, self._plan, self.ctx.read_stats().ring,
                                              self.model.facts.n_expert, max_swaps=self.cfg.repick_swaps,
                                              window=self.cfg.repick_window, margin=self.cfg.repick_margin)
        if plan is self._plan:
            return
        with self._lock:
            self._plan = plan
            self._repicks += 1
            self._repick_swaps += swaps
            self._repick_bytes += moved
            self._upload_bytes += moved

    def _commit_stage(self) -> None:
        try:
            plan, swaps, moved = self._stager.poll(self._plan)        # type: ignore[union-attr]
        except cache_mod.CacheError as e:
            self.notices.append(f"re-pick copy failed, re-picks continue from the current plan: {e}")
            return
        if swaps:
            with self._lock:
                self._plan = plan
                self._repick_swaps += swaps
                self._repick_bytes += moved
                self._upload_bytes += moved

    def _drain_stage(self) -> None:
        if self._stager is not None:
            self._stager.drain()

    def slots_info(self) -> str:
        """One line for the slots dialog: bytes per slot, the pack now, what the free VRAM would hold."""
        f = self.model.facts
        layers = [il for il in f.moe_layers if il < f.n_layer]
        per_slot = f.slab_bytes * len(layers)
        line = f"one slot per layer = {per_slot / 2**20:.0f} MiB; pack now {cache_mod.pack_bytes(self.model.ptr) / 2**20:.0f} MiB"
        gpus = [] if self.cfg.pack_host else native.gpus()
        if gpus and per_slot:
            from ..profiles.plan import auto_slots

            free = max(g.free for g in gpus) + cache_mod.pack_bytes(self.model.ptr)   # the old pack is freed first
            line += f"; fits up to {auto_slots(free, len(layers), f.slab_bytes, f.n_expert)} (auto)"
        elif self.cfg.pack_host:
            line += "; no GPU: slots live in host memory"
        return line

    def use_profile(self, path: Path) -> None:
        """Take another profile for the next set_slots (checked against this model there)."""
        self.cfg = dataclasses.replace(self.cfg, profile=Path(path))

    def profile_overlap(self, path: Path) -> float | None:
        """Mean per-layer overlap of the top-S sets of `path` and the active profile at the current S."""
        if self.cfg.profile is None or not self._plan.layers:
            return None
        from ..profiles.profile import from_trace, overlap
        from ..profiles.trace import read_csv

        s = self._plan.slots_per_layer
        a = from_trace(read_csv(Path(self.cfg.profile)), self.model.n_layer_all, self.model.facts.n_expert)
        b = from_trace(read_csv(Path(path)), self.model.n_layer_all, self.model.facts.n_expert)
        layers = list(self._plan.layers)
        return float(overlap(a, b, s)[layers].mean()) if s else None

    # -- recording -------------------------------------------------------------------------------------------

    def start_recording(self) -> None:
        with self._lock:
            self._rec, self._rec_tokens = [], 0

    @property
    def recording(self) -> bool:
        return self._rec is not None

    @property
    def recorded_tokens(self) -> int:
        return self._rec_tokens

    def _keep_recorded_rows(self, before: "stats_mod.RoutingStats", after: "stats_mod.RoutingStats",
                            n_decoded: int, end: int) -> None:
        """The rows this turn wrote (stats.turn_rows: prompt rows of the new prompt part and decode rows)."""
        rows = stats_mod.turn_rows(before, after, self.model.facts.n_expert_used, end)
        if rows is None:
            return
        with self._lock:
            assert self._rec is not None
            self._rec.append(rows)
            self._rec_tokens += n_decoded

    def stop_recording(self, path: Path) -> "Trace":
        """Write what was recorded (atomically) and stop; returns the trace."""
        from ..profiles.trace import from_ring, write_csv

        with self._lock:
            if self._rec is not None and not self._rec_tokens:   # never replace a profile with an empty one
                raise EngineError(f"nothing recorded yet (no decode token since recording began): {path} not "
                                  "written; still recording")
            rec, self._rec = self._rec, None
        if rec is None:
            raise EngineError("not recording")
        f = self.model.facts
        rows = np.concatenate(rec) if rec else np.zeros((0, 2 + f.n_expert_used), np.int32)
        t = from_ring(rows, self.routing_meta(self._rec_tokens))
        write_csv(t, Path(path))
        return t

    def routing_meta(self, tokens: int) -> dict[str, str]:
        """The `# key=value` facts a recorded profile carries (a profile of another model is refused by them)."""
        f = self.model.facts
        return {"arch": f.arch, "n_layer": str(self.model.n_layer_all), "n_expert": str(f.n_expert),
                "k": str(f.n_expert_used), "model": Path(f.path).name.replace(" ", "_"), "tokens": str(tokens)}

    # -- snapshot --------------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._lock:
            plan, f, ptr = self._plan, self.model.facts, self.ctx.ptr
            st = self._recent.update(lambda rows: stats_mod.read(ptr, self.model.n_layer_all, f.n_expert,
                                                                 f.n_expert_used, rows))   # the new rows only
            layers = [LayerSnapshot(*v) for v in recent_mod.layer_views(
                self._recent.counts, st, plan.slots_of, [il for il in f.moe_layers if il < f.n_layer])]
            n_dec = self._decode_tokens
            misses = int(st.misses.sum())
            whatif = self._whatif[0]
            return Snapshot(
                whatif=whatif, model_name=f.name, load_line=self.load_line, layers=tuple(layers), gpu_share=st.hit_rate,
                cpu_experts_per_token=misses / n_dec if n_dec else 0.0,
                upload_mb_per_token=self._upload_bytes / n_dec / 1e6 if n_dec else 0.0,
                tok_s_last=self._tok_s[-1] if self._tok_s else 0.0, tok_s_rolling=tuple(self._tok_s),
                prompt_tok_s=self._prompt_tok_s,
                mtp_drafted=self.mtp.stats.drafted if self.mtp else 0,
                mtp_accepted=self.mtp.stats.accepted if self.mtp else 0,
                mtp_line=self.mtp_auto.line() if self.mtp_auto else ("MTP on (always)" if self.mtp else ""),
                pack_bytes=cache_mod.pack_bytes(self.model.ptr), recording=self._rec is not None,
                generating=self._generating, repicks=self._repicks, repick_swaps=self._repick_swaps,
                repick_mb=self._repick_bytes / 1e6, repick_every=self.cfg.repick_every, repick_auto=self._auto_line,
                reread=self._reread)

    def _update_whatif(self, st: "stats_mod.RoutingStats", plan: SlotPlan, n_dec: int) -> None:
        """The simulator (profiles.simulate) on the recent ring: what LRU and re-elect-16 would hit with the same
        slots. Run by the generating thread after each reply (it is a Python loop over tokens); snapshots read the
        cached line."""
        if n_dec == self._whatif[1] or not plan.layers:
            return
        from ..profiles.simulate import simulate
        from ..profiles.trace import from_ring

        ring = st.ring[st.ring[:, 0] >= 0][-256 * max(1, len(plan.layers)):]
        if len(ring) < 8:
            return
        slots = plan.slots_per_layer
        try:
            res = {r.policy: r.hit_rate for r in simulate(from_ring(ring, {"n_expert": str(self.model.facts.n_expert)}),
                                                          slots, ["lru", "reelect-16"])}
        except ValueError:
            return
        self._whatif = (f"what-if @{slots}: static {100 * st.hit_rate:.0f} %  lru {100 * res['lru']:.0f} %  "
                        f"re-elect {100 * res['reelect-16']:.0f} %", n_dec)

    def close(self, timeout: float = 30.0) -> None:
        """Free everything; waits (up to `timeout`) for a reply in progress to finish — cancel it first — so a
        worker thread never decodes on a freed model (the app quits this way)."""
        busy = getattr(self, "_busy", None)
        got = busy.acquire(timeout=timeout) if busy is not None else False
        try:
            self._close()
        finally:
            if got:
                busy.release()

    def close_at_exit(self) -> None:
        """The interpreter is exiting (engine.model's atexit hook): close unless a reply is still being generated
        on another thread; then leave the native objects to the OS rather than free them under that thread."""
        busy = getattr(self, "_busy", None)
        if busy is not None and not busy.acquire(timeout=2.0):
            model_mod.untrack(getattr(self, "mtp", None), getattr(self, "ctx", None), getattr(self, "model", None))
            return
        try:
            self._close()
        finally:
            if busy is not None:
                busy.release()

    def _close(self) -> None:
        if getattr(self, "_auto", None) is not None:
            self._auto.close()                         # the last reply's profile save finishes first
        if getattr(self, "_stager", None) is not None:
            self._stager.close()
            self._stager = None
        with self._lock:
            if getattr(self, "mtp", None) is not None:
                self.mtp.close()
                self.mtp = None
            if getattr(self, "ctx", None):
                self.ctx.close()
            self.model.close()
