"""What the app sees of the engine (design §4): the configuration, the chat events, the snapshot, and the `Engine`
protocol that engine.engine.Engine implements and the app (tui/) types against — tests drive the app with fakes
of it (tests/fakes.py).

    eng = engine.Engine(EngineConfig(model=path, slots=64 | "auto" | 0, profile=path | None))
    for ev in eng.chat(messages, cancel=event):   # a worker thread; TextDelta..., then Done(stats, text)
        ...
    eng.snapshot() -> Snapshot                    # immutable, cheap, from any thread

Open and chat from threads that end with their work (the app: engine.runtime.passing_thread for the load, a
thread per reply), or from one thread throughout: a thread that has computed keeps its OpenMP team while it lives,
and two teams over the CPUs make every wait of both sleep.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Protocol, Sequence, Union

from ..profiles.policy import STATIC, Policy
from .errors import EngineError
from .native.expert_cache import SlotPlan

if TYPE_CHECKING:
    from ..profiles.trace import Trace


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    model: Path
    n_ctx: int = 4096                               # tokens; 0: the model's trained length, at most 32768 and
                                                    # what the free memory holds (engine.window.default_ctx)
    slots: Union[int, str, SlotPlan, None] = 0      # n per layer or "auto" (both need a profile), a plan, 0/None
    profile: Path | None = None
    mtp: bool = True                                # MTP drafts when the model has a NextN block
    mtp_draft: int = 1                              # draft length
    mtp_auto: bool = True                           # drafting off while acceptance < measured break-even (mtp_auto)
    mtp_head_on_gpu: bool = True                    # the NextN block's experts on the GPU (else host, no slots):
                                                    # the fastest placement measured (docs/performance.md)
    threads: int | None = None
    pack_host: bool = False                         # hot packs in host memory (tests / CPU-only)
    mmap: Union[bool, str] = "auto"                 # experts mmap'ed (pageable); False: read into pinned host
                                                    # memory — prompts ~5x faster (docs/performance.md), RAM held;
                                                    # "auto": pinned when free RAM holds them (engine.hardware)
    auto_profile: bool = False                      # no profile given: plan from the first prompt, record and
                                                    # save one per model, use it next time (engine.autoprofile)
    async_cpu: bool = False                         # host chain overlaps the GPU chain (patch 0002; process-wide;
                                                    # off by default: no gain measured, docs/performance.md)
    stats_ring: int = 1 << 16                       # routing rows kept (recording reads each turn's rows from it)
    repick_every: int = 0                           # re-pick residents every N decode tokens (0: static cache)
    repick_swaps: int = 4                           # at most M swaps per layer per re-pick
    repick_window: int = 64                         # decode tokens whose routing elects the residents
    repick_margin: float = 0.25                     # a candidate must beat the incumbent by this much (hysteresis)
    repick_overlap: bool = True                     # re-pick copies on a worker thread while decoding (patch 0005:
                                                    # one spare pack entry per layer when re-picking at load)
    repick_auto_every: int = 0                      # after set_repick_auto: decide again every N decode tokens from
                                                    # this session's routing (0: the load-time decision stands)
    policy: Policy = STATIC                         # residency (profiles.policy.Policy: its name and --tier; a name
                                                    # is parsed here): static | hybrid (a core + a dynamic tier) |
                                                    # dynamic (all slots a tier) | fetch, fetch-split (a tier the GPU
                                                    # steps; pinned experts) | auto (simulated on the profile under
                                                    # this machine's costs): engine.residency, engine.native_tier
    calibrate: str = "first-run"                    # auto's costs: "first-run" (measured by themselves the first
                                                    # time this model shape runs here, where a GPU holds the
                                                    # slots: engine.autocal), "always" (also without a GPU), "off"
    temperature: float = 0.0
    max_tokens: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        """The policy is parsed here, once (a name or a Policy), and checked against re-picks: both move slots."""
        try:
            pol = Policy.parse(self.policy)
            pol.check_repick(self.repick_every)
        except ValueError as e:
            raise EngineError(str(e)) from None
        object.__setattr__(self, "policy", pol)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How a reply's tokens are drawn (per chat in the app). temperature 0 is greedy: the argmax, exactly, whatever
    top_p, top_k and min_p say. Else a draw from softmax(logits / temperature) cut to its nucleus: the most likely
    tokens whose probability reaches top_p (1: all). seed None: each reply draws afresh; a number: each reply starts
    from that seed (a reply repeats exactly when MTP drafting is off: drafts use draws too).

    Before temperature and top-p (engine.mtp.sample, llama.cpp's rules): repeat_penalty divides the positive logit and
    multiplies the negative one of every token among the last repeat_last_n (prompt included; greedy too), top_k
    keeps the k highest logits, min_p keeps the tokens whose probability is at least min_p x the most likely one's.
    The defaults (1, 0, 0) change nothing. max_tokens caps a reply's length (0: the engine's, EngineConfig)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int = 0                      # 0: off
    min_p: float = 0.0                  # 0: off
    repeat_penalty: float = 1.0         # 1: off
    repeat_last_n: int = 64             # the tokens the penalty looks back over
    max_tokens: int = 0                 # 0: the engine's default

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def reshapes(self) -> bool:
        """The penalty, top-k or min-p change the logits (False: temperature and top-p alone, as before them)."""
        return self.repeat_penalty != 1 or self.top_k != 0 or self.min_p != 0

    def problem(self) -> str | None:
        """What is wrong with these settings, in one line; None when they are usable."""
        if not (_number(self.temperature) and 0 <= self.temperature <= 5):
            return f"temperature {self.temperature}: use a number from 0 (greedy) to 5"
        if not (_number(self.top_p) and 0 < self.top_p <= 1):
            return f"top-p {self.top_p}: use a number above 0 and at most 1 (1: no cut)"
        if self.seed is not None and not (_whole(self.seed) and 0 <= self.seed < 2**63):
            return f"seed {self.seed}: use a whole number from 0 to 2^63-1, or none"
        if not (_whole(self.top_k) and 0 <= self.top_k <= TOP_K_MAX):
            return f"top-k {self.top_k}: use a whole number from 0 (off) to {TOP_K_MAX}"
        if not (_number(self.min_p) and 0 <= self.min_p <= 1):
            return f"min-p {self.min_p}: use a number from 0 (off) to 1"
        if not (_number(self.repeat_penalty) and 1 <= self.repeat_penalty <= PENALTY_MAX):
            return f"repeat penalty {self.repeat_penalty}: use a number from 1 (off) to {PENALTY_MAX:g}, e.g. 1.1"
        if not (_whole(self.repeat_last_n) and 1 <= self.repeat_last_n <= WINDOW_MAX):
            return f"repeat window {self.repeat_last_n}: use a whole number of tokens from 1 to {WINDOW_MAX}"
        if not (_whole(self.max_tokens) and 0 <= self.max_tokens <= WINDOW_MAX):
            return f"max tokens {self.max_tokens}: use a whole number from 1 to {WINDOW_MAX}, or 0 (the default)"
        return None

    def line(self) -> str:
        """e.g. "greedy", "T 0.7 · top-p 0.9 · seed 42", "greedy · repeat 1.1 (last 64) · max 256 tokens"."""
        if self.greedy:
            head = ["greedy"]
        else:
            head = [f"T {self.temperature:g}", *([f"top-p {self.top_p:g}"] if self.top_p < 1 else []),
                    *([f"top-k {self.top_k}"] if self.top_k else []),
                    *([f"min-p {self.min_p:g}"] if self.min_p else []),
                    f"seed {self.seed}" if self.seed is not None else "random seed"]
        return " · ".join([*head, *([f"repeat {self.repeat_penalty:g} (last {self.repeat_last_n})"]
                                    if self.repeat_penalty != 1 else []),
                           *([f"max {self.max_tokens} tokens"] if self.max_tokens else [])])


TOP_K_MAX = 1_000_000       # more than any vocabulary
PENALTY_MAX = 10.0
WINDOW_MAX = 131_072        # tokens: the repeat window and a reply's length, at most a large context


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


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
    dropped: int = 0                      # oldest messages the model no longer sees (the context is full:
                                          # engine.window); 0: it read the whole chat
    n_ctx: int = 0                        # the context's size in tokens (0: not known)

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
    n_expert: int = 0                     # experts per layer of the model (0: not known)
    policy: str = "static"                # residency policy in force: static, hybrid, dynamic, fetch, fetch-split
    tier_slots: int = 0                   # dynamic slots per layer (the last ones of each layer's slots)
    policy_line: str = ""                 # the policy in force, or `--policy auto`'s decision and why ("" no slots)
    split_per_token: tuple[float, float, float] = (0.0, 0.0, 0.0)   # decode picks per token served by the core
                                          # slots, by the tier, computed on the CPU (static: tier 0)
    tier_uploads_per_token: float = 0.0   # misses uploaded into the tier per decode token (used in that token)
    progress: str = ""                    # long work under way (the first-run calibration's step), "" when none
    window_since: str = ""                # what began the window the routing figures count ("load", "the slots
                                          # changed", "the policy changed"; "" from an engine that keeps none)
    window_tokens: int = 0                # decoded rows in that window (MTP verify rows included)


class Engine(Protocol):
    """The engine as the app uses it. Every call but snapshot() runs on a worker thread of the app."""

    load_line: str                        # "expert cache: L layers x S slots, X MiB uploaded to DEV"
    notices: list[str]                    # lines for the user, in order; the app shows each new one once

    @property
    def profile(self) -> Path | None: ...             # the profile the slots are planned from (None: none)

    @property
    def recorded_tokens(self) -> int: ...             # decode tokens recorded since start_recording()

    def chat(self, messages: Sequence[Message], cancel: threading.Event | None = None,
             sampling: Sampling | None = None) -> Iterator[Union[TextDelta, Done]]: ...   # None: greedy
    def snapshot(self) -> Snapshot: ...
    def new_chat(self) -> None: ...
    def set_slots(self, plan_or_n: Union[int, str, SlotPlan, None]) -> str: ...   # returns the new load line
    def slots_info(self) -> str: ...                                              # one line for the slots dialog
    def set_repick(self, every: int) -> str: ...                                  # 0: static; returns a line
    def start_recording(self) -> None: ...
    def stop_recording(self, path: Path) -> "Trace": ...
    def profile_overlap(self, path: Path) -> float | None: ...
    def use_profile(self, path: Path) -> None: ...
    def close(self) -> None: ...
