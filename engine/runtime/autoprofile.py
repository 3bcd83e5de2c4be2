"""A profile for the user's own model without asking: `moeslots chat MODEL` with no --profile.

- No profile saved for this model yet: the slots are planned from the first prompt's routing (its prompt rows in
  the stats ring, top-S experts per layer by picks), before the first token is decoded; at the next prompt, once
  the chat has decoded enough tokens, they are planned again from the decode routing recorded so far.
- Every session records its decode routing (the same rows manual recording keeps, engine.stats.turn_rows) and
  saves it, merged with what was saved before, to $XDG_DATA_HOME/moeslots/profiles/auto/<key>.csv at the end of
  each reply once it holds MIN_TOKENS decode tokens — atomically, on a background thread, never emptier than
  what was there.
- A later session on the same model file (same key: name, size and a hash of the GGUF header) starts with that
  profile, as if it had been passed with --profile.

The Engine calls attach() at load and the three hooks below; nothing here runs without EngineConfig.auto_profile.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from ... import configfile
from ...profiles.plan import plan_from_counts
from ...profiles.trace import Trace, TraceError, from_ring, merge, read_csv, write_csv
from ..errors import EngineError
from ..llm import ggufhead
from ..native import lib as native
from ..native import routing_stats
from ..native.expert_cache import SlotPlan
from .slot_plans import slot_count

if TYPE_CHECKING:
    from .engine import Engine

MIN_TOKENS = 64          # decode tokens a session records before its first save (a shorter one says little)
MAX_TOKENS = 8192        # decode tokens a saved profile keeps (the newest): plans settle long before, files stay small
HASH_BYTES = 16 << 20    # the header hash covers at most this much (a GGUF header is a few MB)


def profiles_dir() -> Path:
    return configfile.data_dir() / "profiles" / "auto"


def model_key(model: Path) -> str:
    """name + size + a hash of the GGUF header (key/values and tensor infos), not of the whole file."""
    model = Path(model)
    size = model.stat().st_size
    try:
        end = min(ggufhead.read_header(model).end, HASH_BYTES)
    except ggufhead.HeaderError:
        end = min(size, 1 << 20)
    with open(model, "rb") as fh:
        digest = hashlib.sha256(fh.read(end)).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", model.name.removesuffix(".gguf"))[:80]
    return f"{stem}-{size}-{digest}"


def saved_path(model: Path, root: Path | None = None) -> Path:
    return (root or profiles_dir()) / f"{model_key(model)}.csv"


def _tilde(p: Path) -> str:
    home = str(Path.home())
    return "~" + str(p)[len(home):] if str(p).startswith(home + "/") else str(p)


def read_saved(path: Path) -> Trace | None:
    """The saved profile when it exists and holds decode rows; a damaged one is moved aside (never silently
    overwritten) and None returned."""
    if not path.is_file():
        return None
    try:
        t = read_csv(path)
    except TraceError:
        path.replace(path.with_suffix(".damaged.csv"))
        return None
    return t if t.decode_tokens > 0 else None


class _Saver:
    """One background writer; a save asked for while one runs replaces the one waiting (the newest wins)."""

    def __init__(self, on_error: Callable[[str], None]):
        self._lock = threading.Lock()
        self._job: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None
        self._on_error = on_error

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._job = job
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="moeslots-autoprofile", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                job, self._job = self._job, None
                if job is None:
                    self._thread = None
                    return
            try:
                job()
            except Exception as e:  # a full disk must not end the chat; said once, the file intact
                self._on_error(f"could not save the recorded profile: {e}")

    def flush(self, timeout: float = 60.0) -> None:
        with self._lock:
            t = self._thread
        if t is not None:
            t.join(timeout)


@dataclasses.dataclass
class AutoProfile:
    path: Path                        # where this model's profile is saved
    base: "Trace | None"              # what earlier sessions saved (each save is base + this session)
    slots: int | str                  # the plan's size: N, "auto", or 0 (plan nothing)
    plan_first_prompt: bool           # no saved profile: plan from the first prompt
    notify: Callable[[str], None]
    rows: list[np.ndarray] = dataclasses.field(default_factory=list)
    tokens: int = 0                   # decode tokens recorded this session
    saved_tokens: int = 0             # of them, in the file
    planned: SlotPlan | None = None   # the plan this module applied (re-planned only while it still holds)
    replanned: bool = False
    saver: _Saver | None = None

    def __post_init__(self) -> None:
        self.saver = _Saver(self.notify)

    # -- hooks ---------------------------------------------------------------------------------------------------

    def after_prefill(self, eng: "Engine") -> None:
        """The prompt is in the KV cache, nothing decoded yet: plan slots from its routing (first prompt), or from
        the decode routing recorded so far (the next prompt after MIN_TOKENS)."""
        if not self.plan_first_prompt or self.replanned:
            return
        if self.planned is None:
            ring = eng.ctx.read_stats().ring
            n = _slot_count(eng, self.slots)
            if n and self._apply(eng, ring[ring[:, 0] < 0], n):
                self.notify(f"slots planned from your first prompt: {n} of {eng.model.facts.n_expert} per layer")
            else:
                self.plan_first_prompt = False        # nothing to plan (no GPU and no --slots): record only
        elif self.tokens >= MIN_TOKENS and eng.state.plan is self.planned:   # the user has not changed the slots since
            self.replanned = True
            if self._apply(eng, np.concatenate(self.rows), self.planned.slots_per_layer):
                self.notify(f"slots planned again from this chat's first {self.tokens} decode tokens")

    def after_reply(self, eng: "Engine", before: "routing_stats.RoutingStats", after: "routing_stats.RoutingStats",
                    n_decoded: int, end: int) -> None:
        rows = routing_stats.turn_rows(before, after, eng.model.facts.n_expert_used, end)
        if rows is None:
            return
        self.rows.append(rows[rows[:, 0] >= 0])       # decode rows: what plans are made of
        self.tokens += n_decoded
        if self.tokens >= MIN_TOKENS and self.tokens > self.saved_tokens:
            self._save(eng, np.concatenate(self.rows), self.tokens)

    def close(self) -> None:
        if self.saver is not None:
            self.saver.flush()

    # -- internals -----------------------------------------------------------------------------------------------

    def _apply(self, eng: "Engine", rows: np.ndarray, n: int) -> bool:
        f = eng.model.facts
        layers = [il for il in f.moe_layers if il < f.n_layer]
        rows = rows[np.isin(rows[:, 1], layers)]
        keys = (rows[:, 1:2].astype(np.int64) * f.n_expert + rows[:, 2:]).ravel()
        counts = np.bincount(keys, minlength=eng.model.n_layer_all * f.n_expert).reshape(-1, f.n_expert)
        plan = SlotPlan(plan_from_counts(counts, n, layers))
        if eng.cfg.profile is None:
            eng.residency.auto.prompt_routing(rows)      # what `--policy auto` scores until a profile is saved
        try:
            eng.apply_plan(plan)
        except EngineError as e:
            self.notify(f"slots not planned: {e}")
            return False
        self.planned = plan
        return True

    def _save(self, eng: "Engine", rows: np.ndarray, tokens: int) -> None:
        session = from_ring(rows, eng.routing_meta(tokens))
        base, path = self.base, self.path

        def job() -> None:
            t = merge([base, session], [str(path), "this session"]) if base is not None else session
            t = _newest(t, MAX_TOKENS)
            if base is not None and t.decode_tokens < base.decode_tokens and t.decode_tokens < MAX_TOKENS:
                return                                # never replace a profile with a smaller one
            write_csv(t, path)
            if not self.saved_tokens and base is None:
                self.notify(f"profile for this model saved: {_tilde(path)} ({t.decode_tokens} decode tokens); the "
                            "next session starts with it")
            self.saved_tokens = tokens
            with eng.state.lock:                           # the generating thread replaces cfg under it too
                if eng.cfg.profile is None:
                    eng.use_profile(path)             # Ctrl+S (a number or auto) now plans from it

        assert self.saver is not None
        self.saver.submit(job)


def _newest(t: Trace, max_tokens: int) -> Trace:
    """The rows of the newest max_tokens decode tokens (a saved profile does not grow without bound)."""
    per_token = len(np.unique(t.layer)) if t.n_rows else 1
    keep = max_tokens * per_token
    if t.n_rows <= keep:
        return t
    meta = dict(t.meta, tokens=str(max_tokens))
    return Trace(t.pos[-keep:], t.layer[-keep:], t.ids[-keep:], meta)


def _slot_count(eng: "Engine", slots: int | str) -> int:
    """S for a plan: a number as given, "auto" as for a profile (what fits the free VRAM; half the experts with
    packs in host memory), nothing on a machine without a GPU unless packs in host memory were asked for."""
    if slots in (0, "0", None):
        return 0
    if slots == "auto" and not eng.cfg.pack_host and not native.gpus():
        return 0
    return slot_count(eng.model, slots, pack_host=eng.cfg.pack_host, spare=eng.residency.may_move())


def attach(eng: "Engine") -> "AutoProfile | None":
    """At load (EngineConfig.auto_profile): None when a profile was given (it wins). A saved profile for this model
    becomes the engine's profile; without one, the first prompt will plan the slots. Says which in a notice."""
    cfg = eng.cfg
    if cfg.profile is not None:
        return None
    path = saved_path(cfg.model)
    base = read_saved(path)
    name = eng.model.facts.name
    where = _tilde(path)
    if base is not None:
        eng.state.configure(profile=path)
        eng.notices.append(f"using the profile saved for this model: {where} ({base.decode_tokens} decode tokens); "
                           "this session's routing is added to it")
        return AutoProfile(path, base, cfg.slots if isinstance(cfg.slots, (int, str)) else 0, False,
                           eng.notices.append)
    slots = cfg.slots if isinstance(cfg.slots, (int, str)) else 0
    plans = slots not in (0, "0", None) and not (slots == "auto" and not cfg.pack_host and not native.gpus())
    ap = AutoProfile(path, None, slots, plans, eng.notices.append)
    if not plans:
        eng.notices.append(f"no profile for {name}: recording one to {where} (no slots planned: "
                           f"{'no GPU' if not native.gpus() else 'slots 0'}; --slots N plans them from your first "
                           "prompt)")
    else:
        eng.notices.append(f"no profile for {name}: slots planned from your first prompt; recording one to {where}")
    return ap
