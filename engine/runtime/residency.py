"""Adaptive residency for one Engine: re-picks (`--repick N`, F3), `--repick auto` (at load from the profile, then
live from the chat's own routing), and the dynamic tier (`--policy hybrid|dynamic|auto`, engine.native_tier: the
engine's own, uploads now decided inside the graph).

Every N decode tokens the residents of each layer are elected from the recent window's picks (profiles.plan.elect,
the simulator's rule) and only the swapped slabs are copied — synchronously between two tokens, or on a worker
thread while decoding goes on (engine.cache.Stager, a spare pack entry per layer). `--repick auto` chooses N with
the simulator (profiles.repick) under this machine's costs (Engine.cost_model), and with repick_auto_every > 0
decides again after every that many decode tokens. The Engine owns the plan and its lock; this object owns the
counters, the auto decisions and the overlapped copies.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from ...profiles import repick as chooser
from ...profiles.costs import CostModel
from ...profiles.policy import SPLIT_BY_COST, STATIC, Policy
from ...profiles.policy import name as policy_name
from ...profiles.trace import TraceError, from_ring, read_csv
from ..errors import EngineError
from ..native import expert_cache
from ..native.expert_cache import SlotPlan
from ..native.routing_stats import RoutingStats
from ..native.tier import NativeTier
from .autopolicy import AutoPolicy
from .window_stats import POLICY

if TYPE_CHECKING:
    from .engine import Engine
    from .window_stats import Figures

AUTO_EVERY = 256   # `--repick auto` decides again after this many decode tokens of the chat: the intervals it can
                   # choose (1, 16, 100) each fire at least twice in them, and it is short enough to follow a topic
                   # (every 64 flapped, every 512 reacted late in simulation)


class PolicyFields(TypedDict, total=False):
    """The Snapshot's policy fields (engine.api.Snapshot) as Residency.snapshot_fields gives them."""
    policy: str
    tier_slots: int
    policy_line: str
    split_per_token: tuple[float, float, float]
    tier_uploads_per_token: float
    cpu_experts_per_token: float


@dataclasses.dataclass(frozen=True)
class TierChoice:
    """The policy decided for one plan (Residency.decide): its name, its tier slots per layer, the line said."""
    policy: str
    tier: int
    line: str

    @property
    def device(self) -> bool:
        """The GPU steps the tier (fetch, fetch-split): Policy.gpu_stepped."""
        return Policy(self.policy).gpu_stepped

    @property
    def share(self) -> bool:
        """The CPU computes a share of the tier's misses (fetch-split): Policy.cpu_share."""
        return Policy(self.policy).cpu_share


class Residency:
    def __init__(self, eng: "Engine") -> None:
        self.eng = eng
        self.since = 0                                    # decode tokens since the last re-pick
        self.repicks = self.swaps = self.bytes = 0        # re-picks done, slabs swapped, bytes moved in all
        self.auto_line = ""                               # --repick auto: the last decision, for the snapshot
        self.auto_mark: tuple[int, SlotPlan] | None = None  # live auto: (decode tokens, plan) when last decided
        self.spare = False                                # the packs have a spare entry (overlapped re-picks)
        self.stager: expert_cache.Stager | None = None      # overlapped re-pick copies (created on first use)
        self.tier: NativeTier | None = None               # --policy hybrid|dynamic: the dynamic tier of the plan
        self.end_tier_pending = False                     # re-picks asked for while decoding: the tier ends next step
        self.policy_line = ""                             # the policy in force (auto: its decision and why)
        self.auto = AutoPolicy(eng)                       # --policy auto: its decisions and their check
        # the policy asked for (flags, config): F3's re-picks set it aside (static while they run: both move slots)
        # and F3 off brings it back, its tier with the next plan (restore_policy: before the next reply)
        self.asked = eng.cfg.policy
        self.restore_policy = False

    def _overlapped_repicks(self) -> bool:
        cfg = self.eng.cfg
        return cfg.repick_overlap and cfg.repick_every > 0

    def may_move(self) -> bool:
        """Whether slots may move under this configuration by copies that need a spare slab per layer (overlapped
        re-picks; the tier writes into its own slots): `--slots auto` leaves room for it."""
        return self._overlapped_repicks()

    def decide(self, plan: SlotPlan) -> TierChoice:
        """The policy for a plan about to be configured (Engine.apply_plan): as asked, or `auto`'s choice simulated
        on the profile under this machine's costs. Decides only; plan_applied puts it in."""
        cfg = self.eng.cfg
        S = plan.slots_per_layer
        if cfg.policy.gpu_stepped and self.eng.model.opts.use_mmap and not cfg.pack_host:
            raise EngineError(f"--policy {cfg.policy}: the GPU reads missed experts from pinned host memory, and this "
                              "model's experts are mmap'ed (pageable); load it with --no-mmap, or choose another "
                              "policy")
        if cfg.policy.is_auto:
            pol, d, why = self.auto.decide(S)
            return TierChoice(pol, d, f"auto: {why}")
        try:
            d = cfg.policy.tier_for(S, used=self.eng.model.facts.n_expert_used)
        except ValueError as e:
            raise EngineError(f"--policy {cfg.policy}: {e}") from None
        pol = cfg.policy.name if cfg.policy.gpu_stepped and d else policy_name(S, d)
        line = pol + (f": {S - d} core + {d} tier slots" if d else "")
        if d and pol in SPLIT_BY_COST:     # the misses' split follows these costs
            line += f" [{self.eng.cost_model()[1]}]"
        return TierChoice(pol, d, line)

    def plan_applied(self, plan: SlotPlan, spare: bool, choice: TierChoice) -> None:
        """A new plan is in (Engine.apply_plan, under the engine's lock) with the policy decided for it: live auto
        scores from it on; the tier (if any) starts from it."""
        self.spare = spare
        self.policy_line = choice.line
        if self.auto_mark is not None:
            self.auto_mark = (self.eng.state.decode_tokens, plan)
        self._close_tier()
        tier = choice.tier
        if self.end_tier_pending:                 # F3 while this plan went in: no tier for it
            self._end_tier()
            tier = 0
        if tier > 0 and plan.layers:
            eng = self.eng
            self.tier = NativeTier(eng.model.ptr, plan, tier, eng.cost_model()[0], device=choice.device,
                                   share=choice.share)

    def snapshot_fields(self, w: "Figures") -> PolicyFields:
        """The Snapshot's policy fields: the policy, its tier, the per-token split (core / tier / CPU), tier
        uploads per token and the experts computed in host memory per token: with a tier, the tier's CPU misses (the
        routing stats count a miss uploaded in its own token as a miss: it was not resident when picked), else the
        window's. Both count from the last change: the tier is made with each plan, `w` is the window since
        (engine.window_stats)."""
        t = self.tier
        if t is not None:
            core, tier, cpu, up = t.split()
            return {"policy": ("fetch-split" if t.share else "fetch") if t.device
                    else policy_name(t.plan.slots_per_layer, t.tier),
                    "tier_slots": t.tier,
                    "policy_line": self.policy_line, "split_per_token": (core, tier, cpu),
                    "tier_uploads_per_token": up, "cpu_experts_per_token": cpu}
        return {"policy": "static", "policy_line": self.policy_line if self.eng.state.plan.layers else "",
                "split_per_token": w.split_per_token, "cpu_experts_per_token": w.cpu_per_token}

    def _end_tier(self) -> None:
        """The tier gives its slots to re-picks (eng.state.lock held, no decode running): the plan it left, static."""
        eng = self.eng
        self.end_tier_pending = False
        if self.tier is not None:
            eng.state.set_plan(self.tier.refresh())  # from what the tier left in the slots (nothing is in flight)
            self._close_tier()
        eng.state.configure(policy=STATIC)
        self.policy_line = "static (re-picks on: the dynamic tier is off)"
        self._new_window()

    def _new_window(self) -> None:
        """The policy changed (eng.state.lock held): the inspector's figures count from here (engine.window_stats)."""
        eng = self.eng
        eng.counts_window.mark(eng.ctx.read_stats(), POLICY, eng.state.upload_bytes)

    def generation_ended(self) -> None:
        """The reply's decodes are done (eng.state.lock held): a tier end asked for during them happens now; a
        GPU-stepped tier's counts (read every few tokens while decoding) are read up to the reply's last token."""
        if self.end_tier_pending:
            self._end_tier()
        elif self.tier is not None and self.tier.device:
            plan = self._read_tier(0, force=True)
            if plan is not None:
                self.eng.state.set_plan(plan)

    def _read_tier(self, n_new: int, *, force: bool) -> SlotPlan | None:
        """The tier's counts since it was last read (a GPU-stepped one's every few tokens, or now with force), the
        bytes it copied added to the engine's; returns the plan the cache holds when it is due (NativeTier.step)."""
        assert self.tier is not None
        before = self.tier.counts.bytes
        plan = self.tier.step(n_new, force=force)
        self.eng.state.add_uploads(self.tier.counts.bytes - before)
        return plan

    def _close_tier(self) -> None:
        if self.tier is not None:
            if self.tier.device:                   # its counts since the last reading (every few tokens) first
                self._read_tier(0, force=True)
            self.tier.close()
            self.tier = None

    def set_repick(self, every: int, swaps: int | None = None, *, auto: bool = False) -> str:
        """Turn adaptive residency on (re-pick every `every` decode tokens) or off (0); effective from the next
        token. A choice made here (auto=False) ends `--repick auto`'s live decisions. Returns a line for the user."""
        eng = self.eng
        if every < 0:
            raise EngineError("re-pick interval must be >= 0")
        back = ""
        with eng.state.lock:                           # the app's thread (F3) and the generating one (live auto)
            changed = every != eng.cfg.repick_every
            if every:                             # re-picks and a moving policy both move slots: re-picks win
                eng.state.configure(policy=STATIC)
            if every and self.tier is not None:
                if eng.state.generating or eng.state.busy.locked():
                    # a decode or a slot change may be running: the thread holding the engine ends the tier
                    # between two decodes (step), when the reply ends, or when the new plan goes in
                    self.end_tier_pending = True
                else:
                    self._end_tier()
            elif every:                           # no tier running (no slots yet, or one pending): set aside too
                self.end_tier_pending = self.end_tier_pending or eng.state.busy.locked()
            elif eng.cfg.repick_every and self.asked.moves_slots:   # F3 off: the policy asked for comes back
                self.end_tier_pending = False
                eng.state.configure(policy=self.asked, repick_every=0)
                self.restore_policy = bool(eng.state.plan.layers)
                back = f"; --policy {self.asked} again" + (" from the next reply" if self.restore_policy else "")
            self.restore_policy = self.restore_policy and not every
            if changed:                           # re-picks on, off or another interval: a new window of figures
                self._new_window()
            eng.state.configure(repick_every=every, repick_swaps=eng.cfg.repick_swaps if swaps is None else swaps)
            self.since = 0
            was_auto = bool(self.auto_line)
            if not auto:
                self.auto_mark, self.auto_line = None, ""
        return ((f"re-pick every {every} tokens, at most {eng.cfg.repick_swaps} swaps per layer" if every
                 else "no re-picks") + (back or ("" if every else ": static residency"))
                + (" (re-pick auto off)" if was_auto and not auto else ""))

    def set_auto(self, cost: CostModel | None = None) -> str:
        """Choose the re-pick interval by simulating the active profile's trace at the current slots under a cost
        model (default: this machine's, Engine.cost_model); returns the one-line reason."""
        eng = self.eng
        if eng.cfg.profile is None or not eng.state.plan.layers:
            raise EngineError("--repick auto needs a profile and slots")
        slots = eng.state.plan.slots_per_layer
        source = "given costs"
        if cost is None:
            cost, source = eng.cost_model()
        try:
            n, why = chooser.choose_repick(read_csv(Path(eng.cfg.profile)), slots, cost,
                                           max_swaps=eng.cfg.repick_swaps, margin=eng.cfg.repick_margin)
        except (TraceError, ValueError) as e:
            raise EngineError(f"--repick auto: {e}") from None
        self.set_repick(n, auto=True)
        line = f"{why} [{source}]"
        live = eng.cfg.repick_auto_every > 0
        with eng.state.lock:
            self.auto_line = f"auto: {line}"
            self.auto_mark = (eng.state.decode_tokens, eng.state.plan) if live else None
        return line + (f"; decided again every {eng.cfg.repick_auto_every} tokens from this chat's own routing"
                       if live else "")

    def before_reply(self) -> None:
        """Before a reply (the engine held): a switch `auto`'s check asked for goes in now, the same plan under the
        runner-up (or back to the first choice), and is said."""
        restore, self.restore_policy = self.restore_policy, False
        if self.auto.take_pending() or (restore and self.eng.state.plan.layers):
            self.eng.apply_plan(self.eng.state.plan)
            self.eng.notices.append(f"residency: {self.policy_line}")

    def after_reply(self, st: RoutingStats, n_dec: int, n: int, seconds: float) -> None:
        """A reply decoded n tokens in `seconds` (n_dec in all): live `--repick auto` decides again; `auto`'s check
        weighs the speed (its verdict said once)."""
        self.redecide(st, n_dec)
        verdict = self.auto.timed(n, seconds)
        if verdict:
            self.eng.notices.append(verdict)

    def redecide(self, st: RoutingStats, n_dec: int) -> None:
        """Live `--repick auto` (cfg.repick_auto_every > 0), after a reply: once that many decode tokens have passed
        since the last decision, score static and each interval on them, from the plan held when they began
        (profiles.repick.choose_repick_from), and switch if another interval wins. A profile recorded earlier
        cannot see the drift of this chat; these tokens can."""
        eng = self.eng
        mark, every = self.auto_mark, eng.cfg.repick_auto_every
        if mark is None or every <= 0 or n_dec - mark[0] < every or not eng.state.plan.layers:
            return
        # decode rows of the slot layers (not the NextN block's, whose experts never sit in slots)
        ring = st.ring[(st.ring[:, 0] >= 0) & np.isin(st.ring[:, 1], list(mark[1].layers))]
        was = eng.cfg.repick_every
        try:
            cost, _ = eng.cost_model()
            n, why = chooser.choose_repick_from(from_ring(ring, {"n_expert": str(eng.model.facts.n_expert)}),
                                                mark[1].layers, cost, last=n_dec - mark[0], current=was,
                                                whole=True, max_swaps=eng.cfg.repick_swaps,
                                                margin=eng.cfg.repick_margin)
        except Exception as e:  # a short ring, a calibration edited mid-chat: never end the reply
            n, why = was, f"kept ({e}); decides again on the next {every} tokens"
        with eng.state.lock:
            if self.auto_mark is not mark:
                return                          # F3 or a slot change while deciding: the user's choice stands
            if n != was:
                self.set_repick(n, auto=True)
            self.auto_mark = (n_dec, eng.state.plan)
            self.auto_line = (f"auto @{n_dec} tokens: {why}" if n == was
                              else f"auto @{n_dec} tokens, {'static' if not was else f'every {was}'} -> {why}")

    def step(self, n_new: int) -> None:
        """After each decode step of `n_new` tokens (cfg.repick_every > 0): every N decode tokens, elect residents
        per layer from the recent window's picks and copy only the swapped slabs."""
        eng = self.eng
        if self.tier is not None:
            before = self.tier.counts.bytes
            plan = self.tier.step(n_new)                           # between decodes: its counts, now and then the plan
            moved = self.tier.counts.bytes - before
            if plan is not None or moved or self.end_tier_pending:
                with eng.state.lock:                   # (not every token: snapshots hold this lock)
                    if plan is not None:
                        eng.state.set_plan(plan)
                    eng.state.add_uploads(moved)
                    if self.end_tier_pending:     # F3 during this reply: between two decodes, the tier ends
                        self._end_tier()
            return
        if self.stager is not None:
            self._commit_stage()                                   # between decodes: the copies that are in
        n = eng.cfg.repick_every
        if n <= 0 or not eng.state.plan.layers:
            return
        self.since += n_new
        if self.since < n:
            return
        self.since = 0
        cfg, f = eng.cfg, eng.model.facts
        if self.spare and cfg.repick_overlap:
            if self.stager is None:
                self.stager = expert_cache.Stager(eng.model.ptr)
            if self.stager.busy:
                return                                             # the last re-pick's copies are still coming in
            swaps_of = expert_cache.elect_swaps(eng.state.plan, eng.ctx.read_stats().ring, f.n_expert,
                                             max_swaps=cfg.repick_swaps, window=cfg.repick_window,
                                             margin=cfg.repick_margin)
            if swaps_of:
                with eng.state.lock:
                    self.repicks += 1
                self.stager.begin(swaps_of)
            return
        plan, swaps, moved = expert_cache.repick(eng.model.ptr, eng.state.plan, eng.ctx.read_stats().ring, f.n_expert,
                                              max_swaps=cfg.repick_swaps, window=cfg.repick_window,
                                              margin=cfg.repick_margin)
        if plan is eng.state.plan:
            return
        with eng.state.lock:
            eng.state.set_plan(plan)
            self.repicks += 1
            self._moved(swaps, moved)

    def _commit_stage(self) -> None:
        eng = self.eng
        try:
            plan, swaps, moved = self.stager.poll(eng.state.plan)        # type: ignore[union-attr]
        except expert_cache.CacheError as e:
            eng.notices.append(f"re-pick copy failed, re-picks continue from the current plan: {e}")
            return
        if swaps:
            with eng.state.lock:
                eng.state.set_plan(plan)
                self._moved(swaps, moved)

    def _moved(self, swaps: int, nbytes: int) -> None:
        self.swaps += swaps
        self.bytes += nbytes
        self.eng.state.add_uploads(nbytes)

    def drain(self) -> None:
        """Copies in flight are dropped (before the packs are rebuilt; the caller holds the engine, _busy); a tier
        end asked for meanwhile happens now (its policy is static from this plan on)."""
        if self.stager is not None:
            self.stager.drain()
        with self.eng.state.lock:
            if self.end_tier_pending:
                self._end_tier()
            self._close_tier()

    def close(self) -> None:
        self._close_tier()
        if self.stager is not None:
            self.stager.close()
            self.stager = None
