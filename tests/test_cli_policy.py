"""`--policy` on the command line: chat refuses a policy with --repick and --tier without hybrid (one line, exit 2,
before any model loads); `bench repick` takes --every and/or --policy and says which flags belong to which; the
config's [app] policy is read when no flag is given."""

from __future__ import annotations

import argparse
from pathlib import Path

from test_cli import _one_line_error, run


def test_chat_policy_errors(tiny_glm: Path) -> None:
    _one_line_error(run("chat", str(tiny_glm), "--policy", "hybrid", "--repick", "16"), "--policy hybrid and --repick",
                    "both move slots")
    _one_line_error(run("chat", str(tiny_glm), "--policy", "static", "--tier", "4"), "--tier D", "--policy hybrid")
    r = run("chat", str(tiny_glm), "--policy", "lru")
    assert r.returncode == 2 and "invalid choice: 'lru'" in r.stderr


def test_bench_repick_policy_flags(tiny_glm: Path) -> None:
    _one_line_error(run("bench", "repick", str(tiny_glm)), "needs --every", "--policy")
    _one_line_error(run("bench", "repick", str(tiny_glm), "--policy", "hybrid,lfu"), "--policy takes")
    _one_line_error(run("bench", "repick", str(tiny_glm), "--policy", "hybrid", "--overlap"), "re-pick flags")


def test_the_config_policy_is_the_default(tmp_path: Path) -> None:
    from moeslots.cli import launch

    a = argparse.Namespace(profile=None, slots=None, policy=None, tier=None)
    assert launch.resolve(tmp_path / "m.gguf", a, {"policy": "static"}).policy == "static"
    assert launch.resolve(tmp_path / "m.gguf", a, {}).policy is None             # decided by the machine:
    assert launch.default_policy(None, gpu=True, repick=None) == "auto"          # auto where a GPU holds slots
    assert launch.default_policy(None, gpu=False, repick=None) == "static"
    assert launch.default_policy(None, gpu=True, repick="16") == "static"        # re-picks move the slots
    assert launch.default_policy("hybrid", gpu=False, repick=None) == "hybrid"   # as asked
    a.repick = "16"
    assert launch.resolve(tmp_path / "m.gguf", a, {}).policy == "static"
    a.repick = None
    a.policy, a.tier = "hybrid", 3
    s = launch.resolve(tmp_path / "m.gguf", a, {"policy": "auto"})
    assert (s.policy, s.tier) == ("hybrid", 3)


def test_chat_negative_slots_is_one_line(tiny_glm: Path) -> None:
    _one_line_error(run("chat", str(tiny_glm), "--slots", "-1"), "--slots -1", "not negative")
