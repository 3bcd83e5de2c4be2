"""`moeslots bench` on a tiny model with host packs: decode rows for every slot count, hit rate rising with slots, no
weight bytes to a GPU; compare: greedy text at S slots equal to 0 slots' on the CPU; mtp and repick."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeslots.engine.bench import decode
from moeslots.engine.bench import drafts as mtp
from moeslots.engine.bench import policies as repick


def test_bench_rows(tiny_qwen: Path) -> None:
    logs: list[str] = []
    rows, info = decode.run(tiny_qwen, [0, 4, 8], n_decode=8, prompt_len=40, threads=2, pack_host=True,
                            log=logs.append)
    assert [r.slots for r in rows] == [0, 4, 8]
    assert rows[0].hit_rate == 0.0 and 0.0 < rows[1].hit_rate < rows[2].hit_rate
    assert all(r.upload_mb_per_token == 0.0 and r.decode_tok_s > 0 and r.prompt_tok_s > 0 for r in rows)
    assert all(r.splits == 1 for r in rows)                  # CPU build: one backend, one run per graph
    assert info["routing"] == "the model's router"
    table = decode.render(rows, info)
    assert table.count("\n| ") == 4 and "| 8 |" in table
    (same,) = decode.compare(tiny_qwen, [8], prompts=1, tokens=6, threads=2, pack_host=True, log=logs.append)
    assert (same.slots, same.agreement, same.same_texts) == (8, 1.0, 1)          # exact on the CPU
    assert decode.render_compare_row(same) == "| 8 | 100.0 % | 1 of 1 |"


def test_bench_all_gpu_and_cpu_prompts(tiny_qwen: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--all-gpu: one stock row (no host experts, no cache) whatever slots are asked; --no-op-offload reaches the
    context and the table's header says where prompt batches computed the experts that are not in slots."""
    rows, info = decode.run(tiny_qwen, [0, 4], n_decode=6, prompt_len=40, threads=2, all_gpu=True, with_stats=False,
                            log=lambda m: None)
    (r,) = rows
    assert r.slots == info["n_expert"] and r.load_line.startswith("every expert on the GPU") and r.pack_mib == 0.0
    assert "every expert on the GPU (stock llama.cpp, no cache)" in decode.render(rows, info)
    seen: list[bool] = []
    real = decode.Context.__init__

    def spy(self: decode.Context, *a: object, **k: object) -> None:
        real(self, *a, **k)                                     # type: ignore[arg-type]
        seen.append(self.op_offload)

    monkeypatch.setattr(decode.Context, "__init__", spy)
    rows, info = decode.run(tiny_qwen, [4], n_decode=6, prompt_len=40, threads=2, pack_host=True, op_offload=False,
                            log=lambda m: None)
    assert seen == [False] and "prompt 40 (host experts on the CPU)" in decode.render(rows, info)


def test_repick_bench_overlapped_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_repick import stage_waits

    from moeslots.engine.machine import bundled

    stage_waits(monkeypatch)

    rows, _ = repick.run_repick(bundled.model(), [8], [0, 2], [str(bundled.profile("chat"))], n_decode=24,
                                profile_rows=256, threads=2, pack_host=True, overlap=True, log=lambda m: None)
    static, every2 = rows
    assert static.swaps == 0 and every2.swaps > 0 and every2.mb_moved_per_token > 0
    assert every2.scheduler_mb_per_token == 0.0


def test_repick_bench_matches_the_simulator() -> None:
    from moeslots.engine.machine import bundled

    # an interval longer than the window too: the engine elects from the last `window` tokens, so must the sim
    logs: list[str] = []
    rows, info = repick.run_repick(bundled.model(), [8], [0, 4, 12, 40], [str(bundled.profile("code")), "uniform"],
                                  n_decode=36, profile_rows=256, threads=2, pack_host=True, window=6,
                                  log=logs.append)
    assert any("re-pick 40 never fires in 36" in line for line in logs)
    assert not any("re-pick 12 never" in line for line in logs)
    assert [(r.routing, r.every) for r in rows] == [("moeslots-tiny-glm4moe-code", n) for n in (0, 4, 12, 40)] + [
        ("uniform", n) for n in (0, 4, 12, 40)]
    for r in rows:
        assert r.hit_rate == pytest.approx(r.sim_hit_rate, abs=1e-9)      # same rows, same election rule
        assert r.scheduler_mb_per_token == 0.0
        assert (r.swaps > 0) == (0 < r.every < 36) and (r.mb_moved_per_token > 0) == (r.swaps > 0)
    assert "split" not in info["routings"]["uniform"]
    assert info["n_moe"] == 6                      # the bundled model's MoE layers (scripts/repick_table.py reads it)


def test_mtp_bench_times_each_phase() -> None:
    from moeslots.engine.machine import bundled

    rows = mtp.run_mtp(bundled.model(), [0, 8], [2], n_tokens=24, threads=2, pack_host=True, mtp_head="host",
                         prompt_text="What does `json.dumps` do?", log=lambda m: None)
    for r in rows:
        feed, drafts, verify, rest = r.ms_step
        assert verify > 0 and drafts > 0 and feed >= 0 and rest >= 0
        assert 1000 / r.mtp_tok_s * r.tokens_per_step >= 0.9 * (feed + drafts + verify)   # phases fit in a step
        assert r.same_prefix == 24 if r.same_text else r.same_prefix < 24


def test_restore_puts_the_plan_back(tiny_qwen: Path) -> None:
    """The re-pick bench reuses one pack per slot count: after a policy's swaps the initial plan comes back, by
    swaps, or by a reconfigure when an expert moved between slots."""
    from moeslots.engine.llm.model import LoadOptions, Model
    from moeslots.engine.native import expert_cache as cache
    from moeslots.engine.native.expert_cache import SlotPlan

    with Model(tiny_qwen, LoadOptions(extra_bufts=False)) as m:
        plan0 = SlotPlan({0: (1, 2, 3), 1: (4, 5, 6)})
        m.set_slots(plan0, pack_host=True)
        cache.swap(m.ptr, 0, 1, 9)                                  # 2 -> 9
        repick._restore(m, SlotPlan({0: (1, 9, 3), 1: (4, 5, 6)}), plan0, True)
        assert cache.swap(m.ptr, 0, 1, 2) == 0                       # 2 is back in slot 1 (no bytes to move)
        cache.swap(m.ptr, 1, 0, 8)                                   # 4 -> 8, then 4 comes back in slot 2
        cache.swap(m.ptr, 1, 2, 4)
        repick._restore(m, SlotPlan({1: (8, 5, 4), 0: (1, 2, 3)}), plan0, True)
        assert cache.swap(m.ptr, 1, 0, 4) == 0 and cache.swap(m.ptr, 1, 2, 6) == 0


def test_repick_bench_runs_live_auto_as_the_simulator_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench repick --every auto`: the interval chosen from the profile rows, then again every `auto_every` tokens;
    the engine's hits equal the simulator's on the same schedule, and the switches are in the row."""
    from moeslots.engine.machine import bundled
    from moeslots.profiles import repick as chooser
    from moeslots.profiles.costs import CostModel

    cheap = CostModel(slab_mb=1.0, cpu_gbps=1e-3, pcie_gbps=1e6, gpu_gbps=1000.0, base_ms=0.0)
    dear = CostModel(slab_mb=1.0, cpu_gbps=10.0, pcie_gbps=1e-6, gpu_gbps=1000.0, base_ms=0.0)

    def run(cost: CostModel) -> tuple[repick.RepickRow, repick.RepickRow]:
        rows, _ = repick.run_repick(bundled.model(), [8], [0, repick.AUTO], [str(bundled.profile("chat"))],
                                   n_decode=48, profile_rows=256, threads=2, pack_host=True, window=8, cost=cost,
                                   auto_every=16, log=lambda m: None)
        static, auto = rows
        assert auto.every == repick.AUTO and auto.hit_rate == pytest.approx(auto.sim_hit_rate, abs=1e-9)
        return static, auto

    static, auto = run(dear)                                 # uploads too dear: static throughout
    assert auto.decisions == "0:0" and auto.swaps == 0 and auto.hit_rate == static.hit_rate
    static, auto = run(cheap)                                # cheap: re-picks from the load-time decision on
    assert auto.decisions.startswith("0:") and auto.decisions != "0:0" and auto.swaps > 0
    # the load-time decision said static (a profile that did not see this drift): a live decision switches
    monkeypatch.setattr(chooser, "choose_repick", lambda *a, **k: (0, "static (test)"))
    static, auto = run(cheap)
    assert auto.decisions.startswith("0:0 ") and auto.swaps > 0 and auto.hit_rate > static.hit_rate
    assert f"| auto ({auto.decisions}) |" in repick.render_repick_row(auto)
    # switching away from re-picking on a token where a re-pick falls due: the engine does that re-pick first,
    # and so must the simulator (it once dropped it: 0.157 engine vs 0.115 simulated on 0:16 16:0)
    monkeypatch.setattr(chooser, "choose_repick", lambda *a, **k: (16, "every 16 (test)"))
    for then in (0, 1):
        monkeypatch.setattr(chooser, "choose_repick_from", lambda *a, then=then, **k: (then, "(test)"))
        static, auto = run(cheap)
        assert auto.decisions == f"0:16 16:{then}"


def test_repick_bench_profile_from_another_trace(tmp_path: Path) -> None:
    """`--profile-from`: the plan comes from another trace's rows (a profile that does not match the chat); the
    replayed routing is the same, so hits drop, and the row says which profile it used."""
    from moeslots.engine.machine import bundled

    kw = dict(n_decode=24, profile_rows=256, threads=2, pack_host=True, log=lambda m: None)
    chat, code = str(bundled.profile("chat")), str(bundled.profile("code"))
    (own,), _ = repick.run_repick(bundled.model(), [8], [0], [chat], **kw)
    (other,), info = repick.run_repick(bundled.model(), [8], [0], [chat], profile_from=code, **kw)
    assert other.routing == f"{Path(chat).stem} (profile: {Path(code).stem})" and info["profile_from"] == code
    assert other.hit_rate == pytest.approx(other.sim_hit_rate, abs=1e-9) and other.hit_rate != own.hit_rate
    short = tmp_path / "short.csv"
    lines = Path(code).read_text().splitlines(keepends=True)
    end = next(i for i, x in enumerate(lines) if x[0] not in "#p" and int(x.split(",")[0]) == 50)
    short.write_text("".join(lines[:end]))                                   # the first recording's 50 tokens
    with pytest.raises(ValueError, match="needs 256 rows"):
        repick.run_repick(bundled.model(), [8], [0], [chat], profile_from=str(short), **kw)
