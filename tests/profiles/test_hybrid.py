"""The hybrid residency simulator (static core + dynamic tier, misses split by cost): its limits are the static cache
(no tier) and a dynamic cache (free uploads); it follows drifting routing a static plan cannot; dear uploads make
the static core the best choice."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moeslots.profiles import hybrid
from moeslots.profiles.costs import CostModel
from moeslots.profiles.simulate import static_hits

ROOT = Path(__file__).resolve().parents[2]


def _uniform(T: int, L: int, E: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((T, L, E)), axis=2)[:, :, :k].astype(np.int32)


def _drifting(T: int, L: int, E: int, k: int, hot: int, every: int, seed: int = 1) -> np.ndarray:
    """Each token picks k of a hot set of `hot` experts that moves to new experts every `every` tokens."""
    rng = np.random.default_rng(seed)
    P = np.empty((T, L, k), np.int32)
    for t in range(T):
        base = (t // every) * hot % E
        for layer in range(L):
            P[t, layer] = (base + rng.choice(hot, k, replace=False)) % E
    return P


def test_best_split_balances_cpu_and_uploads() -> None:
    assert hybrid.best_split(8, 1.0, 1.0, 16) == 4
    assert hybrid.best_split(8, 1.0, 1.0, 2) == 2           # no more than the tier holds
    assert hybrid.best_split(8, 1.0, 3.0, 16) == 2          # max(2*3, 6*1) = 6 is the least
    assert hybrid.best_split(8, 1.0, 1e-9, 16) == 8         # free uploads: all
    assert hybrid.best_split(8, 1e-9, 1.0, 16) == 0         # free CPU: none
    assert hybrid.best_split(0, 1.0, 1.0, 16) == 0


def test_no_tier_is_the_static_cache() -> None:
    P = _uniform(200, 3, 32, 4)
    core = np.zeros((3, 32), bool)
    core[:, :12] = True
    r = hybrid.simulate_hybrid(P, core, 0, CostModel(slab_mb=1.0))
    hr, cpu = static_hits(P, core)
    assert r.policy == "static" and r.hit_rate == pytest.approx(hr) and r.cpu_picks_per_token == pytest.approx(cpu)
    assert r.sync_uploads_per_token == r.prefetch_per_token == 0


def test_free_uploads_make_a_dynamic_cache_with_nothing_on_the_cpu() -> None:
    P = _uniform(200, 3, 32, 4)
    r = hybrid.simulate_hybrid(P, np.zeros((3, 32), bool), 8, CostModel(slab_mb=1.0, pcie_gbps=1e9))
    assert r.policy == "dynamic" and r.cpu_picks_per_token == 0
    assert r.sync_uploads_per_token == pytest.approx(3 * 4 * (1 - r.hit_rate), rel=1e-6)


def test_a_tier_follows_drifting_routing_and_dear_uploads_keep_the_core() -> None:
    P = _drifting(400, 2, 64, 4, hot=8, every=50)
    counts = np.stack([np.bincount(P[:100, layer].ravel(), minlength=64) for layer in range(2)])   # a stale profile
    cheap = hybrid.sweep(P[100:], counts, 16, CostModel(slab_mb=3.0, pcie_gbps=55.0), tiers=[0, 8])
    assert cheap[1].hit_rate > cheap[0].hit_rate + 0.3 and cheap[1].ms_per_token < cheap[0].ms_per_token
    dear = hybrid.sweep(P[100:], counts, 16, CostModel(slab_mb=3.0, pcie_gbps=0.01), tiers=[0, 8])
    assert dear[1].sync_uploads_per_token == 0 and dear[0].ms_per_token <= dear[1].ms_per_token


def test_the_staged_mechanism_lands_a_token_later_one_per_layer() -> None:
    """IDEAL: a prefetch decided at token t is resident at t + 1; STAGED: a prefetch staged while t + 1 decodes,
    committed after it, resident at t + 2; one copy per layer in flight; no uploads now."""
    P = np.zeros((4, 1, 1), np.int32)                          # expert 0, four times; the tier holds expert 7
    core, first = np.zeros((1, 8), bool), np.zeros((1, 8), bool)
    first[0, 7] = True
    cost = CostModel(slab_mb=1.0, pcie_gbps=1e6)
    ideal = hybrid.simulate_hybrid(P, core, 1, cost, initial=first)
    eng = hybrid.simulate_hybrid(P, core, 1, cost, initial=first, mech=hybrid.STAGED)
    assert (ideal.hit_rate, eng.hit_rate) == (0.75, 0.5)
    assert ideal.sync_uploads_per_token == 1 / 4 and eng.sync_uploads_per_token == 0   # ideal uploaded it at once
    P2 = np.array([[[0, 1]], [[2, 3]], [[0, 1]], [[0, 1]]], np.int32)   # two misses a token, a tier of 2
    first2 = np.zeros((1, 8), bool)
    first2[0, 6:] = True
    rule = hybrid.Tier(core, 2, cost, initial=first2, mech=hybrid.STAGED)
    s0 = rule.step(P2[0])
    assert [p[:2] for p in s0.prefetches] == [(0, 1)] and rule.pending == {0: (1, 6)}   # one, the higher id on
    assert rule.step(P2[1]).prefetches == []                                          # ties; none while in flight
    assert rule.land(0) == (1, 6) and rule.in_tier[0, 1] and not rule.in_tier[0, 6]
    with pytest.raises(ValueError, match="one copy in flight"):
        hybrid.Mechanism(lag=1)


def test_choose_policy_by_cost() -> None:
    from moeslots.profiles.policy import choose_policy, tier_slots
    from moeslots.profiles.repick import Picks

    P = _drifting(600, 2, 64, 4, hot=8, every=150)
    pk = Picks(P, [0, 1], 64)
    cheap = choose_policy(pk, 16, CostModel(slab_mb=3.0, cpu_gbps=5.0, pcie_gbps=55.0))
    assert cheap[0] in ("hybrid", "dynamic") and cheap[1] > 0 and "faster" in cheap[2], cheap
    assert choose_policy(pk, 16, CostModel(slab_mb=3.0, cpu_gbps=5.0, pcie_gbps=55.0)) == cheap   # deterministic
    dear = choose_policy(pk, 16, CostModel(slab_mb=3.0, pcie_gbps=0.01))
    assert dear[:2] == ("static", 0) and dear[2].startswith("static: "), dear
    assert (tier_slots("static", 16), tier_slots("hybrid", 16), tier_slots("hybrid", 16, 3),
            tier_slots("dynamic", 16), tier_slots("hybrid", 0)) == (0, 4, 3, 16, 0)
    assert tier_slots("fetch-split", 16, used=4) == tier_slots("fetch", 16, used=4) == 8
    with pytest.raises(ValueError):
        tier_slots("fetch-split", 16, 3, used=4)
    # the GPU-stepped tier (pinned experts): with a CPU that reads as fast as the GPU's copies and a cheap share the
    # CPU share wins; with a dear share (or a slow CPU) every miss is fetched
    pk4 = Picks(_uniform(600, 2, 64, 4, seed=3), [0, 1], 64)
    fast = CostModel(slab_mb=3.0, cpu_gbps=50.0, pcie_gbps=10.0, fetch_gbps=50.0, share_ms=0.001, base_ms=1.0,
                     split_ms=0.5)
    assert choose_policy(pk4, 16, fast, fetch=True, share=True)[0] == "fetch-split"
    assert choose_policy(pk4, 16, fast, fetch=True, share=False)[0] == "fetch"    # share cost not measured here
    assert choose_policy(pk4, 16, dataclasses.replace(fast, share_ms=1.0), fetch=True, share=True)[0] == "fetch"
    assert choose_policy(pk4, 16, dataclasses.replace(fast, cpu_gbps=1.0), fetch=True, share=True)[0] == "fetch"
    assert choose_policy(pk4, 16, fast)[0] not in ("fetch", "fetch-split")        # no pinned experts: never
    with pytest.raises(ValueError):
        tier_slots("hybrid", 4, 5)


def test_cli_simulate_hybrid(tmp_path: Path) -> None:
    trace = ROOT / "profiles/data/moeslots-tiny-glm4moe-chat.csv"
    run = lambda *a: subprocess.run([sys.executable, "-m", "moeslots", "simulate", str(trace), *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    r = run("--slots", "16", "--hybrid", "0,8", "--slab-mb", "0.035")
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| 16 + 0") or ln.startswith("| 8 + 8")]
    assert len(rows) == 2 and "| static |" in rows[0] and "| hybrid |" in rows[1]
    bad = run("--slots", "16", "--hybrid", "99")
    assert bad.returncode == 2 and "tier 99 outside 0..16" in bad.stderr and "Traceback" not in bad.stderr
    alias = run("--slots", "16", "--policy", "hybrid", "--tier", "0,8", "--slab-mb", "0.035")
    assert alias.returncode == 0 and [ln for ln in alias.stdout.splitlines() if ln.startswith("| ")][1:] == rows
    assert "the engine's mechanism" in alias.stdout
    ideal = run("--slots", "16", "--policy", "dynamic", "--mechanism", "ideal", "--slab-mb", "0.035")
    assert ideal.returncode == 0 and "| 0 + 16 | dynamic |" in ideal.stdout and "ideal:" in ideal.stdout
    # mmap'ed experts: uploads from pageable memory (5.3 GB/s by default) add to the CPU's work, and cost more than
    # a CPU expert at 10 GB/s: the split uploads none, where overlapped at the same rate it uploads some
    paged = run("--slots", "16", "--hybrid", "8", "--slab-mb", "0.035", "--cpu-gbps", "10", "--pageable")
    over = run("--slots", "16", "--hybrid", "8", "--slab-mb", "0.035", "--cpu-gbps", "10", "--pcie-gbps", "5.3")
    assert paged.returncode == 0 == over.returncode, paged.stderr + over.stderr
    assert "PCIe 5.3 GB/s" in paged.stdout and "PCIe 5.3 GB/s" in over.stdout
    up = {name: float(next(ln for ln in r.stdout.splitlines() if ln.startswith("| 8 + 8")).split("|")[4])
          for name, r in (("paged", paged), ("over", over))}
    assert up["paged"] == 0 < up["over"], up
    mixed = run("--slots", "16", "--policy", "hybrid", "--policy", "lru")
    assert mixed.returncode == 2 and "runs alone" in mixed.stderr
    # the GPU-stepped tier with a CPU share: its own line, its cost per layer; a cheap share moves misses to the CPU
    split = run("--slots", "16", "--policy", "hybrid", "--tier", "8", "--mechanism", "fetch-split",
                "--slab-mb", "0.035", "--cpu-gbps", "50", "--fetch-gbps", "50", "--share-ms", "0.001")
    assert split.returncode == 0 and "fetch-split (--policy fetch-split)" in split.stdout and "0.001 ms" in split.stdout
    row = next(ln for ln in split.stdout.splitlines() if ln.startswith("| 8 + 8"))
    assert float(row.split("|")[6]) > 0                                  # CPU experts per token
    alone = run("--slots", "16", "--mechanism", "fetch-split")
    assert alone.returncode == 2 and "tier sweep" in alone.stderr and "Traceback" not in alone.stderr
    neg = run("--slots", "16", "--policy", "hybrid", "--mechanism", "fetch-split", "--share-ms", "-1")
    assert neg.returncode == 2 and "--share-ms" in neg.stderr


def test_the_native_mechanism_uploads_now_and_never_transiently() -> None:
    """NATIVE (the engine's): misses split between CPU and uploads now; an upload needs a tier entry the token does
    not pick (IDEAL would make a transient copy), and nothing is prefetched."""
    core = np.zeros((1, 8), bool)
    first = np.zeros((1, 8), bool)
    first[0, 6] = True                                          # a tier of one, holding expert 6
    cost = CostModel(slab_mb=1.0, cpu_gbps=1.0, pcie_gbps=1.0)   # even: half the misses go up
    rule = hybrid.Tier(core, 1, cost, initial=first, mech=hybrid.NATIVE)
    s = rule.step(np.array([[0, 1]]))                            # two misses: one up (into 6's entry), one CPU
    assert s.uploads_now == [(0, 0)] and s.cpu == 1 and s.prefetches == []
    assert rule.in_tier[0, 0] and not rule.in_tier[0, 6]
    s = rule.step(np.array([[0, 2]]))                            # 0 is a tier hit; 2 would need 0's entry: CPU
    assert (s.tier_hits, s.uploads_now, s.cpu) == (1, [], 1)
    ideal = hybrid.Tier(core, 1, cost, initial=first, mech=hybrid.IDEAL)
    ideal.step(np.array([[0, 1]]))
    assert ideal.step(np.array([[0, 2, 3]])).uploads_now == [(0, 2)]   # IDEAL: a transient copy of 2


def test_batched_steps_are_the_engines_only_and_must_cover_the_tokens() -> None:
    """simulate_hybrid(batches=): sizes must sum to the tokens; batched steps model the engine's mechanism (uploads
    now, no prefetch), not the ideal one; a batch of one is the one-token step."""
    rng = np.random.default_rng(3)
    P = rng.integers(0, 16, size=(12, 2, 4))
    core = np.zeros((2, 16), bool)
    core[:, :4] = True
    cost = CostModel(slab_mb=1.0, cpu_gbps=1.0, pcie_gbps=1.0)
    one = hybrid.simulate_hybrid(P, core, 4, cost, mech=hybrid.NATIVE)
    assert hybrid.simulate_hybrid(P, core, 4, cost, mech=hybrid.NATIVE, batches=[1] * 12) == one
    assert hybrid.simulate_hybrid(P, core, 4, cost, mech=hybrid.NATIVE, batches=[3, 4, 5]).hit_rate >= 0
    with pytest.raises(ValueError):
        hybrid.simulate_hybrid(P, core, 4, cost, mech=hybrid.NATIVE, batches=[3, 4])
    with pytest.raises(ValueError):
        hybrid.simulate_hybrid(P, core, 4, cost, mech=hybrid.IDEAL, batches=[3, 4, 5])


def test_the_fetch_mechanism_uploads_every_miss_and_the_split_shares_them() -> None:
    """FETCH (`--policy fetch`): every miss uploaded, none on the CPU, no round trip in the time. FETCH_SPLIT
    (`--policy fetch-split`): each layer's misses split by the engine's rule (share_copies at the cost ratio of a CPU
    expert to a GPU copy); with a CPU far dearer than a copy it uploads as FETCH and pays share_ms per layer on top;
    with a CPU as fast as the GPU's reads and a cheap share the misses are shared and the token is faster."""
    P = _uniform(200, 4, 32, 4, seed=5)
    core, first = hybrid.core_and_tier(np.ones((4, 32)), 12, 6)
    cost = CostModel(slab_mb=1.0, cpu_gbps=50.0, pcie_gbps=10.0, gpu_gbps=1e4, base_ms=1.0, split_ms=0.1,
                     fetch_gbps=50.0, fetch_layer_ms=0.0, share_ms=0.001)
    f = hybrid.simulate_hybrid(P, core, 6, cost, initial=first, mech=hybrid.FETCH)
    host = hybrid.simulate_hybrid(P, core, 6, cost, initial=first, mech=hybrid.ENGINE)
    assert f.cpu_picks_per_token == 0 and f.sync_uploads_per_token > host.sync_uploads_per_token
    assert f.hit_rate == pytest.approx(host.hit_rate, abs=0.05)
    slow = dataclasses.replace(cost, cpu_gbps=0.01, share_ms=1.0)
    dear = hybrid.simulate_hybrid(P, core, 6, slow, initial=first, mech=hybrid.FETCH_SPLIT)
    f2 = hybrid.simulate_hybrid(P, core, 6, slow, initial=first, mech=hybrid.FETCH)
    assert (dear.sync_uploads_per_token, dear.cpu_picks_per_token) == (f2.sync_uploads_per_token, 0.0)
    assert dear.ms_per_token == pytest.approx(f2.ms_per_token + 4 * 1.0)
    shared = hybrid.simulate_hybrid(P, core, 6, cost, initial=first, mech=hybrid.FETCH_SPLIT)
    assert shared.cpu_picks_per_token > 0 and shared.ms_per_token < f.ms_per_token
    # the split is the engine's: ratio 1 (CPU = copy), so u = m/2 rounded down on ties
    assert hybrid.share_ratio(cost) == 1.0
    assert [hybrid.share_copies(m, 1.0, 6) for m in range(6)] == [0, 0, 1, 1, 2, 2]
    assert hybrid.share_copies(5, 4.0, 6) == 4 and hybrid.share_copies(5, 0.25, 6) == 1



def test_a_host_tier_pays_its_route_in_every_layer_and_step() -> None:
    """route_ms (the host tier's route node, engine.route_cost): every step of a host tier costs it in every layer;
    static (no tier) and a GPU-stepped tier (no route node) do not; and a route dear enough keeps `auto` on static
    where a cheap one chose a tier."""
    from moeslots.profiles.policy import choose_policy
    from moeslots.profiles.repick import Picks

    P = _drifting(300, 3, 32, 4, hot=8, every=100)
    core = np.zeros((3, 32), bool)
    core[:, :8] = True
    cost = CostModel(slab_mb=1.0, cpu_gbps=5.0, pcie_gbps=55.0, base_ms=1.0)
    routed = dataclasses.replace(cost, route_ms=0.25)
    for tier, mech, extra in ((4, hybrid.ENGINE, 3 * 0.25), (0, hybrid.ENGINE, 0.0), (8, hybrid.FETCH, 0.0)):
        a = hybrid.simulate_hybrid(P, core, tier, cost, mech=mech, prefetch=False)
        b = hybrid.simulate_hybrid(P, core, tier, routed, mech=mech, prefetch=False)
        assert b.ms_per_token == pytest.approx(a.ms_per_token + extra), (tier, mech)
        assert (b.hit_rate, b.sync_uploads_per_token) == (a.hit_rate, a.sync_uploads_per_token)   # costs only
    pk = Picks(_drifting(600, 2, 64, 4, hot=8, every=150), [0, 1], 64)
    cheap = CostModel(slab_mb=3.0, cpu_gbps=5.0, pcie_gbps=55.0)
    assert choose_policy(pk, 16, cheap)[0] in ("hybrid", "dynamic")
    assert choose_policy(pk, 16, dataclasses.replace(cheap, route_ms=5.0))[0] == "static"
