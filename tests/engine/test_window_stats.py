"""The inspector's figures count one window, since the last slot or policy change (engine.window_stats), so none
contradicts another (a user report: at 256 of 256 slots every layer said miss 0 % while the split said host 56 %,
CPU experts/token 46.5 and the what-if line static 44 %; at 0 slots CPU experts/token 105.8 on a model that can
compute at most 80 per token). Each test failed on the code before: its figures ran from the context's start,
counted the MTP verify rows against emitted tokens, and snapshots said no window."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.native.routing_stats import RoutingStats
from moeslots.engine.runtime.engine import Engine, EngineConfig, Message, Snapshot, TextDelta

TRUNK, K, N_EXPERT = [1, 2], 4, 16        # tiny_glm: MoE layers 1 and 2 (3: the NextN block), 4 of 16 experts


def _reply(e: Engine, ask: str) -> str:
    e.new_chat()
    return "".join(ev.text for ev in e.chat([Message("user", ask)]) if isinstance(ev, TextDelta))


def _static_of(whatif: str) -> float | None:
    m = re.match(r"what-if @\d+: static (\d+) %", whatif)
    return float(m.group(1)) if m else None


def _agree(s: Snapshot) -> None:
    """Every routing figure of one snapshot tells the same story, within what is possible."""
    limit = len(TRUNK) * K                                       # experts one decoded token can pick
    assert 0.0 <= s.gpu_share <= 1.0
    assert 0.0 <= s.cpu_experts_per_token <= limit
    core, tier, cpu = s.split_per_token
    assert cpu == pytest.approx(s.cpu_experts_per_token) and tier == 0.0
    tokens = getattr(s, "window_tokens")
    if tokens:
        assert core + cpu == pytest.approx(limit)                # every decoded row picks k per layer
        assert s.cpu_experts_per_token == pytest.approx(limit * (1 - s.gpu_share))
        misses = [ls.recent_miss_share for ls in s.layers]       # the heatmap's column, over the same picks
        assert all(0.0 <= m <= 1.0 for m in misses)
        assert np.mean(misses) == pytest.approx(1 - s.gpu_share)
        static = _static_of(s.whatif)
        assert static is None or " est." in s.whatif or static == round(100 * s.gpu_share)


def test_every_figure_counts_the_window_since_the_slots_changed(tiny_glm: Path) -> None:
    """The report's session, with MTP drafting every step (verify rows, rejected drafts): some slots, then all 16,
    then none; after each change and after the next reply every figure agrees, and the window says so."""
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=32, mtp=True, mtp_auto=False,
                            slots=SlotPlan.uniform(TRUNK, 6, N_EXPERT)))
    try:
        _reply(e, "tell me about the experts")
        s = e.snapshot()
        _agree(s)
        assert 0 < s.gpu_share < 1 and getattr(s, "window_since") == "the slots changed"
        assert getattr(s, "window_tokens") >= 32                 # decoded rows: every emitted token and more
        assert e.mtp is not None and e.mtp.stats.drafted > 0

        e.set_slots(SlotPlan.uniform(TRUNK, N_EXPERT, N_EXPERT))     # all slots: nothing can miss
        s = e.snapshot()
        assert (getattr(s, "window_since"), getattr(s, "window_tokens")) == ("the slots changed", 0)
        assert s.gpu_share == 0.0 and s.cpu_experts_per_token == 0.0 and s.split_per_token == (0.0, 0.0, 0.0)
        assert all(ls.recent_miss_share == 0.0 for ls in s.layers)
        assert s.whatif == "" or _static_of(s.whatif) == 100.0   # an estimate for the new slots, not the old line
        _reply(e, "and more about it")
        s = e.snapshot()
        _agree(s)
        assert getattr(s, "window_tokens") >= 32
        assert s.gpu_share == 1.0 and s.cpu_experts_per_token == 0.0       # host 0 %, no CPU experts
        assert all(ls.recent_miss_share == 0.0 for ls in s.layers)
        assert s.whatif == "" or _static_of(s.whatif) == 100.0

        e.set_slots(0)                                           # no slots: everything on the host
        s = e.snapshot()
        assert getattr(s, "window_tokens") == 0 and s.cpu_experts_per_token == 0.0 and s.whatif == ""
        _reply(e, "something else entirely")
        s = e.snapshot()
        _agree(s)
        assert s.gpu_share == 0.0 and s.cpu_experts_per_token == pytest.approx(len(TRUNK) * K)   # 100 % host
        assert all(ls.recent_miss_share == 1.0 for ls in s.layers) and s.whatif == ""
    finally:
        e.close()


def test_f3_ending_a_tier_starts_a_new_window(tiny_glm: Path) -> None:
    """A policy change without a slot change (F3: re-picks end the hybrid tier) starts a window too; the figures
    measured under the tier do not carry over, and the next reply's agree."""
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=24, mtp=True, policy="hybrid",
                            slots=SlotPlan.uniform(TRUNK, 6, N_EXPERT)))
    try:
        _reply(e, "tell me about the experts")
        assert getattr(e.snapshot(), "window_tokens") > 0
        e.set_repick(16)                                         # F3 between replies: the tier ends now
        s = e.snapshot()
        assert s.policy == "static"
        assert (getattr(s, "window_since"), getattr(s, "window_tokens")) == ("the policy changed", 0)
        assert s.gpu_share == 0.0 and s.upload_mb_per_token == 0.0
        _reply(e, "and more")
        s = e.snapshot()
        _agree(s)
        assert getattr(s, "window_tokens") > 0
    finally:
        e.close()


def _stats(hits: list[int], misses: list[int], ring: list[list[int]]) -> RoutingStats:
    """Counters of a 4-layer model (layer 3: the NextN block), 16 experts, k 4; decode picks = hits + misses."""
    pd = np.zeros((4, N_EXPERT), np.uint64)
    pd[:, 0] = np.add(hits, misses)
    return RoutingStats(np.zeros((4, N_EXPERT), np.uint64), pd, np.array(hits, np.uint64),
                        np.array(misses, np.uint64), np.array(ring, np.int32).reshape(-1, 2 + K))


def test_the_window_counts_trunk_rows_since_its_mark_and_survives_a_stats_reset(tiny_glm: Path) -> None:
    """Window on synthetic counters: only the trunk's MoE layers count (not the NextN block's picks), per decoded
    row; the ring rows it simulates are the window's decode rows of the trunk; counters below the baseline (a stats
    reset) start it again from zero rather than go negative."""
    from moeslots.engine.llm.facts import inspect_gguf
    from moeslots.engine.runtime.window_stats import SLOTS, Window

    w = Window(inspect_gguf(tiny_glm), 4)
    assert w.trunk == (1, 2)
    w.mark(_stats([0, 4, 4, 0], [0, 4, 4, 0], []), SLOTS, 100)
    rows = [[0, 1, 0, 1, 2, 3], [0, 2, 0, 1, 2, 3], [0, 3, 0, 1, 2, 3], [-5, 1, 0, 1, 2, 3],
            [1, 1, 0, 1, 2, 3], [1, 2, 0, 1, 2, 3], [1, 3, 0, 1, 2, 3]]
    st = _stats([0, 8, 4, 0], [0, 8, 12, 40], rows)               # 2 rows per trunk layer since; NextN: 10 rows
    f = w.figures(st, 300)
    assert f.since == SLOTS and f.tokens == 2 and f.uploaded == 200
    assert f.gpu_share == pytest.approx(4 / 16) and f.cpu_per_token == pytest.approx(6.0)        # <= 2 x 4
    assert f.split_per_token == (2.0, 0.0, 6.0) and f.upload_mb_per_token == pytest.approx(100 / 1e6)
    ring = w.view(st).ring
    assert set(ring[:, 1].tolist()) <= {1, 2} and (ring[:, 0] >= 0).all()
    reset = w.figures(_stats([0, 0, 0, 0], [0, 0, 0, 0], []), 300)        # the counters were reset
    assert reset.tokens == 0 and reset.gpu_share == 0.0 and reset.cpu_per_token == 0.0
    again = w.figures(_stats([0, 4, 4, 0], [0, 4, 4, 0], []), 300)       # from zero: not below the old baseline
    assert again.since == SLOTS and again.tokens == 2 and again.gpu_share == 0.5 and again.cpu_per_token == 4.0
