"""Profiles: CSV round trip and clear errors (fuzzed), merge = concatenation, plans from decode rows only,
simulator policies on traces with known answers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeslots.profiles import plan as plan_mod
from moeslots.profiles import profile as prof
from moeslots.profiles.costs import CostModel
from moeslots.profiles.simulate import simulate, token_matrix
from moeslots.profiles.trace import Trace, TraceError, from_rows, merge, read_csv, write_csv


def _trace(seq: list[list[int]], layer: int = 0, meta: dict | None = None, prompt: list[list[int]] = ()) -> Trace:
    rows = [(-(i + 1), layer, ids) for i, ids in enumerate(prompt)] + [(t, layer, ids) for t, ids in enumerate(seq)]
    return from_rows(rows, meta or {})


def test_round_trip_and_fork_format(tmp_path: Path) -> None:
    t = from_rows([(-1, 1, [3, 4]), (0, 1, [1, 2]), (0, 2, [5, 6]), (1, 1, [1, 7])],
                  {"arch": "glm4moe", "n_layer": "4", "n_expert": "8", "k": "2"})
    p = tmp_path / "a.csv"
    write_csv(t, p)
    back = read_csv(p)
    assert np.array_equal(back.pos, t.pos) and np.array_equal(back.ids, t.ids) and back.meta == t.meta
    fork = tmp_path / "fork.csv"                       # no '#' lines, no header: the fork's llama-moe-trace output
    fork.write_text("0,1,3,4\n0,2,1,0\n1,1,3,5\n")
    f = read_csv(fork)
    assert f.n_rows == 3 and f.k == 2 and f.decode_tokens == 2 and f.n_expert == 6


def test_atomic_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "keep.csv"
    write_csv(_trace([[1, 2]]), p)
    before = p.read_text()
    monkeypatch.setattr(np, "savetxt", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(TraceError, match=r"cannot write .*keep.csv: No space left on device \(the old file is kept\)"):
        write_csv(_trace([[3, 4]]), p)
    assert p.read_text() == before and len(list(tmp_path.iterdir())) == 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="0123456789,-# \nx", max_size=40), max_size=8))
def test_reader_fuzz_gives_trace_errors_only(tmp_path_factory: pytest.TempPathFactory, lines: list[str]) -> None:
    p = tmp_path_factory.mktemp("fuzz") / "f.csv"
    p.write_text("\n".join(lines))
    try:
        t = read_csv(p)
    except TraceError as e:
        assert str(e)
        return
    assert t.ids.ndim == 2 and (t.ids >= 0).all()


@pytest.mark.parametrize("text,needle", [
    ("0,1,2,3\n0,1,2\n", "1 expert ids, earlier rows have 2"),
    ("0,1,2,99999999\n", "expert id out of range"),
    ("0,1\n", "at least one expert id"),
    ("a,b,c\n", "not a trace row"),
    ("# n_expert=4\n0,1,2,7\n", "expert id 7 >= n_expert=4"),
    ("0,99999,1\n", "layer 99999 out of range"),
    ("1" * 30 + ",0,1\n", "position"),
])
def test_malformed_rows_name_the_line(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(TraceError, match=needle):
        read_csv(p)


def test_merge_is_concatenation_and_refuses_other_models() -> None:
    a = _trace([[1, 2], [2, 3]], meta={"arch": "qwen3moe", "n_expert": "8", "n_layer": "2"})
    b = _trace([[4, 5]], meta={"arch": "qwen3moe", "n_expert": "8", "n_layer": "2"})
    m = merge([a, b], ["a", "b"])
    assert np.array_equal(m.ids, np.concatenate([a.ids, b.ids])) and m.meta["tokens"] == "3"
    c = _trace([[1, 2]], meta={"arch": "qwen3moe", "n_expert": "16", "n_layer": "2"})
    with pytest.raises(TraceError, match=r"a \(2 layers x 8 experts.*c \(2 layers x 16 experts"):
        merge([a, c], ["a", "c"])


def test_plan_counts_decode_rows_only_ties_to_lower_ids_and_spreads_empty_layers() -> None:
    t = _trace([[5, 6], [5, 7], [6, 7]], prompt=[[0, 1]] * 50, meta={"n_layer": "2", "n_expert": "8"})
    p = prof.from_trace(t)
    assert p.prompt_counts[0, 0] == 50 and p.counts[0, 0] == 0
    plan = plan_mod.plan_from_counts(p.counts, 2)
    assert plan[0] == (5, 6)                      # 5, 6 and 7 have 2 picks each: ties -> lower ids
    assert plan[1] == (0, 4)                      # no data: even spread
    assert plan_mod.auto_slots(free_bytes=10 << 30, n_layers=48, slab_bytes=3_060_000, n_expert=128,
                               margin_bytes=1 << 30) == 65     # 9 GiB / 48 x 3.06 MB: no zero slot
    assert plan_mod.auto_slots(1 << 29, 48, 3_060_000, 128) == 0
    # slots that move (re-pick copies, a dynamic tier) take a spare slab per layer: room for it is kept
    assert plan_mod.auto_slots(10 << 30, 48, 3_060_000, 128, margin_bytes=1 << 30, spare=True) == 64
    assert plan_mod.auto_slots(48 * 3_060_000 + (1 << 30), 48, 3_060_000, 128, spare=True) == 0


def test_a_prompt_row_on_a_layer_no_decode_row_routes() -> None:
    """The fuzz of a profile's fields found it: a prompt row naming layer 3 where decode rows route layers 1-2 indexed
    past the simulator's counts (IndexError, a traceback from `moeslots simulate`)."""
    from moeslots.profiles.simulate import distinct_per_batch

    rows = [(-1, 3, [1, 2])] + [(t, il, [1, 2]) for t in range(10) for il in (1, 2)]
    t = from_rows(rows, {"arch": "glm4moe", "n_layer": "4", "n_expert": "16", "k": "2"})
    assert [r.hit_rate for r in simulate(t, 2, ["static-profile", "static-oracle"])] == [1.0, 1.0]
    assert simulate(t, 2, ["static-profile"], train=t)[0].hit_rate == 1.0
    assert distinct_per_batch(t, 2, max_batch=2) == {1: 0.0, 2: 0.0}


def test_lru_on_cyclic_patterns() -> None:
    thrash = _trace([[e] for e in [0, 1, 2] * 20])       # 3 experts cycling through 2 slots: LRU always misses
    assert simulate(thrash, 2, ["lru"])[0].hit_rate == 0.0
    pingpong = _trace([[e] for e in [0, 1] * 20])         # 2 experts, 2 slots: only the first two miss
    r = simulate(pingpong, 2, ["lru"])[0]
    assert r.hit_rate == pytest.approx(38 / 40) and r.uploads_per_token == pytest.approx(2 / 40)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 15), min_size=2, max_size=2, unique=True), min_size=5, max_size=60),
       st.lists(st.lists(st.integers(0, 15), min_size=2, max_size=2, unique=True), min_size=5, max_size=60),
       st.integers(0, 16))
def test_the_oracle_is_never_beaten_by_a_static_plan(test_seq, train_seq, slots) -> None:
    meta = {"n_expert": "16", "n_layer": "1"}
    res = {r.policy: r for r in simulate(_trace(test_seq, meta=meta), slots, ["static-profile", "static-oracle"],
                                         train=_trace(train_seq, meta=meta))}
    assert res["static-oracle"].hit_rate >= res["static-profile"].hit_rate - 1e-12


def test_reelect_follows_a_phase_change_and_costs_uploads() -> None:
    seq = [[0, 1]] * 64 + [[8, 9]] * 64
    res = {r.policy: r for r in simulate(_trace(seq, meta={"n_expert": "16", "n_layer": "1"}), 2,
                                         ["static-oracle", "reelect-16"], reelect_window=16)}
    assert res["static-oracle"].hit_rate == pytest.approx(0.5)
    # the first phase wins the initial (tied) plan; 16 tokens after the change the new pair takes over
    assert res["reelect-16"].hit_rate == pytest.approx((64 + 48) / 128)
    assert res["reelect-16"].uploads_per_token == pytest.approx(2 / 128)
    cost = CostModel(slab_mb=1.0, cpu_gbps=1.0, pcie_gbps=1.0, gpu_gbps=1e9, base_ms=0.0)
    r = simulate(_trace([[0, 1]] * 10, meta={"n_expert": "4", "n_layer": "1"}), 0, ["static-oracle"], cost=cost)[0]
    assert r.ms_per_token == pytest.approx(2.0)          # 2 CPU picks x 1 MB at 1 GB/s


def test_token_matrix_groups_layers() -> None:
    t = from_rows([(0, 1, [1]), (0, 3, [2]), (1, 1, [3]), (1, 3, [4]), (2, 1, [5])])
    layers, P = token_matrix(t)
    assert layers == [1, 3] and P.shape == (2, 2, 1) and P[1, 1, 0] == 4


def test_token_matrix_reads_batches_layer_by_layer_and_merged_recordings() -> None:
    # a verify batch of 2 tokens writes layer 1 (pos 5, 6) then layer 3 (pos 5, 6); pos 6 is later re-decoded
    # after a rollback (its last rows win); then a second recording restarts at pos 0
    t = from_rows([(50, 1, [1]), (51, 1, [2]), (50, 3, [3]), (51, 3, [4]), (51, 1, [7]), (51, 3, [8]),
                   (0, 1, [9]), (0, 3, [9])])
    layers, P = token_matrix(t)
    assert layers == [1, 3]
    assert P[:, :, 0].tolist() == [[1, 3], [7, 8], [9, 9]]


def test_simulation_is_fast_enough() -> None:
    import time

    T, L, E, k = 2000, 40, 256, 8
    rng = np.random.default_rng(0)
    ids = rng.integers(0, E, (T * L, k)).astype(np.int32)
    t = Trace(np.repeat(np.arange(T), L).astype(np.int64), np.tile(np.arange(L), T).astype(np.int32), ids,
              {"n_expert": str(E), "n_layer": str(L)})
    t0 = time.perf_counter()
    simulate(t, 64)
    assert time.perf_counter() - t0 < 10


def test_choose_repick_is_deterministic_and_follows_the_costs() -> None:
    from moeslots.profiles.repick import choose_repick

    meta = {"n_expert": "16", "n_layer": "1"}
    phases = _trace([[0, 1]] * 200 + [[8, 9]] * 200 + [[4, 5]] * 200, meta=meta)
    fast_bus = CostModel(slab_mb=1.0, cpu_gbps=10.0, pcie_gbps=1000.0, gpu_gbps=1000.0, base_ms=0.0)
    slow_bus = CostModel(slab_mb=1.0, cpu_gbps=10.0, pcie_gbps=0.001, gpu_gbps=1000.0, base_ms=0.0)
    n1, why1 = choose_repick(phases, 2, fast_bus)
    assert n1 > 0 and "re-pick every" in why1                    # shifting hot sets + cheap uploads: re-pick
    assert choose_repick(phases, 2, fast_bus) == (n1, why1)       # deterministic
    n2, why2 = choose_repick(phases, 2, slow_bus)
    assert n2 == 0 and why2.startswith("static")                 # uploads too dear: stay static


def test_choose_repick_scores_the_plan_on_later_tokens() -> None:
    """The plan comes from the profile's first half and is scored on its second (the app decodes text recorded
    after its profile): a hot set that moves half-way is a drift in-sample scoring cannot see."""
    from moeslots.profiles.repick import choose_repick

    meta = {"n_expert": "16", "n_layer": "1"}
    drift = _trace([[0, 1]] * 300 + [[2, 3]] * 300, meta=meta)
    bus = CostModel(slab_mb=1.0, cpu_gbps=10.0, pcie_gbps=1.0, gpu_gbps=1000.0, base_ms=0.0)
    n, why = choose_repick(drift, 2, bus)
    assert n > 0 and "(static 0 %)" in why and "first 300 tokens, scored on its last 300" in why
    n_in, why_in = choose_repick(drift, 2, bus, holdout=0.0)
    assert "in-sample" in why_in and "(static 50 %)" in why_in
    short = _trace([[0, 1]] * 100 + [[2, 3]] * 100, meta=meta)
    assert "scored in-sample" in choose_repick(short, 2, bus)[1]          # too short to split


def test_choose_repick_needs_a_gain_the_cost_model_can_resolve() -> None:
    """A re-pick that the model says saves 1 % is noise on real hardware: static, and the line says so."""
    from moeslots.profiles.repick import choose_repick

    meta = {"n_expert": "16", "n_layer": "1"}
    drift = _trace([[0, 1]] * 300 + [[2, 3]] * 300, meta=meta)
    expert_bound = CostModel(slab_mb=1.0, cpu_gbps=10.0, pcie_gbps=1.0, gpu_gbps=1000.0, base_ms=0.0)
    base_bound = dataclasses.replace(expert_bound, base_ms=1000.0)       # same savings, drowned in fixed work
    assert choose_repick(drift, 2, expert_bound)[0] > 0
    n, why = choose_repick(drift, 2, base_bound)
    assert n == 0 and "would save" in why and "under 5 %" in why
    assert choose_repick(drift, 2, base_bound, min_gain=0.0)[0] > 0


def test_skew_ignores_layers_that_do_not_route() -> None:
    from moeslots.profiles.profile import Profile, skew

    counts = np.zeros((3, 10), np.int64)
    counts[1] = [10, 0, 0, 0, 0, 0, 0, 0, 0, 0]       # layer 1 only: one expert carries everything
    assert skew(Profile(counts, np.zeros_like(counts), 10, 0), (0.10,))[0.10] == 1.0
    counts[1] = 1                                       # flat: top 10 % of 10 pairs = 1 pair = 10 %
    assert skew(Profile(counts, np.zeros_like(counts), 10, 0), (0.10,))[0.10] == 0.1   # not 3/10 (30 pairs)


def test_union_of_experts_per_batch() -> None:
    from moeslots.profiles.simulate import distinct_per_batch

    t = from_rows([(0, 1, [0, 1]), (1, 1, [1, 2]), (2, 1, [1, 3]), (3, 1, [1, 0])], {"n_expert": "8"}, k=2)
    assert distinct_per_batch(t, 0, max_batch=2) == {1: 2.0, 2: 3.0}       # {0,1,2} and {0,1,3}
    assert distinct_per_batch(t, 1, max_batch=2) == {1: 1.0, 2: 2.0}       # expert 1 resident


def _elect_reference(scores, resident, max_swaps, margin):  # the rule, spelled out slowly
    res = list(resident)
    if not res or max_swaps <= 0:
        return []
    cands = [e for e in sorted(range(scores.size), key=lambda e: (-scores[e], e)) if e not in set(res)]
    order = sorted(range(len(res)), key=lambda s: (scores[res[s]], -res[s]))
    swaps = []
    for cand, slot in zip(cands, order):
        if len(swaps) >= max_swaps or not scores[cand] > scores[res[slot]] * (1.0 + margin):
            break
        swaps.append((slot, cand))
    return swaps


def test_elect_matches_the_rule_spelled_out_on_random_scores_with_ties() -> None:
    import numpy as np

    from moeslots.profiles.plan import elect

    rng = np.random.default_rng(3)
    for _ in range(2000):
        n = int(rng.integers(2, 40))
        scores = rng.integers(0, 6, n).astype(np.float64)          # few values: many ties
        s = int(rng.integers(1, n))
        resident = [int(x) for x in rng.permutation(n)[:s]]
        m, margin = int(rng.integers(0, 6)), float(rng.choice([0.0, 0.25, 1.0]))
        assert elect(scores, resident, m, margin) == _elect_reference(scores, resident, m, margin)


def test_choose_repick_from_scores_the_session_from_the_plan_it_held() -> None:
    """Live `--repick auto`: static is the plan the app held when the scored tokens began (not a plan made from
    them), every interval starts from it, and only the last `last` tokens count."""
    from moeslots.profiles.repick import choose_repick_from

    meta = {"n_expert": "16", "n_layer": "1"}
    bus = CostModel(slab_mb=1.0, cpu_gbps=10.0, pcie_gbps=1.0, gpu_gbps=1000.0, base_ms=0.0)
    session = _trace([[0, 1]] * 300 + [[2, 3]] * 256, meta=meta)
    # the chat moved to experts 2, 3 while the profile's plan holds 0, 1: re-picking follows it
    n, why = choose_repick_from(session, {0: (0, 1)}, bus, last=256)
    assert n > 0 and "(static 0 %)" in why and "last 256 tokens" in why
    assert choose_repick_from(session, {0: (0, 1)}, bus, last=256) == (n, why)       # deterministic
    # the plan already holds what the chat uses: nothing to gain
    n2, why2 = choose_repick_from(session, {0: (2, 3)}, bus, last=256)
    assert n2 == 0 and why2.startswith("static: 100 % hits")
    # scored on the older tokens instead, the same plan {2, 3} would be the one to leave
    assert choose_repick_from(session, {0: (2, 3)}, bus)[0] > 0
    # an interval that cannot fire twice in the scored tokens is not a choice: 100 needs 200 of them
    assert choose_repick_from(_trace([[2, 3]] * 150, meta=meta), {0: (0, 1)}, bus, choices=(0, 100))[0] == 0
    assert choose_repick_from(_trace([[2, 3]] * 250, meta=meta), {0: (0, 1)}, bus, choices=(0, 100))[0] == 100


def test_choose_repick_from_keeps_re_picking_for_a_small_gain() -> None:
    """Hysteresis: starting needs the 5 % bar, stopping needs static to be estimated faster (stopping freezes a
    set elected from the last 64 tokens, a worse static set than a profile's)."""
    from moeslots.profiles.repick import choose_repick_from

    meta = {"n_expert": "16", "n_layer": "1"}
    session = _trace([[0, 1]] * 300 + [[2, 3]] * 256, meta=meta)
    small = CostModel(slab_mb=1.0, cpu_gbps=10.0, pcie_gbps=1.0, gpu_gbps=1000.0, base_ms=1000.0)  # gains < 5 %
    n_off, why = choose_repick_from(session, {0: (0, 1)}, small, last=256)
    assert n_off == 0 and "under 5 %" in why
    assert choose_repick_from(session, {0: (0, 1)}, small, last=256, current=16)[0] > 0
    # nothing to gain at all: stops even while re-picking
    assert choose_repick_from(session, {0: (2, 3)}, small, last=256, current=16)[0] == 0


def test_choose_repick_from_keeps_an_interval_that_ties_static() -> None:
    """Re-picking that swaps nothing costs nothing: while on, a tie keeps it (it still follows drift to come);
    while off, a tie stays static."""
    from moeslots.profiles.repick import choose_repick_from

    meta = {"n_expert": "16", "n_layer": "1"}
    steady = _trace([[2, 3]] * 400, meta=meta)
    bus = CostModel(slab_mb=1.0, cpu_gbps=10.0, pcie_gbps=1.0, gpu_gbps=1000.0, base_ms=0.0)
    n, why = choose_repick_from(steady, {0: (2, 3)}, bus, last=256, current=16)
    assert n == 16 and "kept" in why
    assert choose_repick_from(steady, {0: (2, 3)}, bus, last=256)[0] == 0


def test_residency_decay_weighs_recent_picks() -> None:
    """The what-if knob of the simulator: with decay 1 (the engine's rule) the window's picks count alike, so the
    older but more frequent expert wins the slot; with decay < 1 the recent one does."""
    from moeslots.profiles.simulate import Residency

    P = np.array([[[0]]] * 10 + [[[1]]] * 9, np.int32)                 # [T, L=1, k=1]: ten 0s, then nine 1s
    init = np.zeros((1, 4), bool)
    init[0, 2] = True                                                    # one slot, holding expert 2
    box = Residency(init, 1, window=18, max_swaps=1)
    assert box.advance(P, 17, 19, 1) == (0, 1) and box.slots == [[0]]      # re-pick at 18 on 0..17: ten 0s, eight 1s
    recent = Residency(init, 1, window=18, max_swaps=1, decay=0.8)
    assert recent.advance(P, 17, 19, 1) == (1, 1) and recent.slots == [[1]]  # the 1s are the recent ones: token 18 hits
