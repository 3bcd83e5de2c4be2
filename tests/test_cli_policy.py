"""`--policy` on the command line: chat refuses a policy with --repick and --tier without hybrid (one line, exit 2,
before any model loads); `bench repick` takes --every and/or --policy and says which flags belong to which; the
config's [app] policy is read when no flag is given."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
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
    from moeslots.cli.common import UserError
    from moeslots.profiles.policy import Policy

    a = argparse.Namespace(profile=None, slots=None, policy=None, tier=None)
    assert launch.resolve(tmp_path / "m.gguf", a, {"policy": "static"}).policy == Policy("static")
    assert launch.resolve(tmp_path / "m.gguf", a, {}).policy is None             # decided by the machine:
    assert launch.default_policy(None, gpu=True, repick=None) == Policy("auto")  # auto where a GPU holds slots
    assert launch.default_policy(None, gpu=False, repick=None) == Policy("static")
    assert launch.default_policy(None, gpu=True, repick="16") == Policy("static")   # re-picks move the slots
    assert launch.default_policy(Policy("hybrid"), gpu=False, repick=None) == Policy("hybrid")   # as asked
    a.repick = "16"
    assert launch.resolve(tmp_path / "m.gguf", a, {}).policy == Policy("static")
    a.repick = None
    a.policy, a.tier = "hybrid", 3
    s = launch.resolve(tmp_path / "m.gguf", a, {"policy": "auto"})
    assert s.policy == Policy("hybrid", 3) and s.policy.tier == 3
    a.policy = None                                                              # a tier needs a policy that has one
    with pytest.raises(UserError, match="--tier D"):
        launch.resolve(tmp_path / "m.gguf", a, {})


def test_a_policy_is_parsed_once_into_what_it_means() -> None:
    """The Policy value: what each name means (who steps the tier, whether the CPU takes a share, whether slots
    move), the errors of a name, a tier and re-picks beside it, and EngineConfig parsing a name into one."""
    from moeslots.engine.api import EngineConfig
    from moeslots.engine.errors import EngineError
    from moeslots.profiles.policy import STATIC, Policy

    assert [(p.gpu_stepped, p.cpu_share, p.moves_slots, p.is_auto) for p in map(Policy, (
        "static", "hybrid", "dynamic", "fetch", "fetch-split", "auto"))] == [
        (False, False, False, False), (False, False, True, False), (False, False, True, False),
        (True, False, True, False), (True, True, True, False), (False, False, True, True)]
    assert Policy.parse(None) == STATIC and Policy.parse("fetch", 8) == Policy("fetch", 8)
    assert str(Policy("fetch-split")) == "fetch-split" and Policy("hybrid", 2).tier_for(8) == 2
    for bad, match in ((lambda: Policy("lru"), "--policy takes"), (lambda: Policy("static", 4), "--tier D"),
                       (lambda: Policy("dynamic", 4), "--tier D"), (lambda: Policy("hybrid", -1), "0 or more"),
                       (lambda: Policy("hybrid").check_repick(16), "both move slots")):
        with pytest.raises(ValueError, match=match):
            bad()
    Policy("static").check_repick(16)                                        # static and re-picks: fine
    cfg = EngineConfig(model=Path("m.gguf"), policy="fetch-split")          # type: ignore[arg-type]
    assert cfg.policy == Policy("fetch-split") and cfg.policy.cpu_share
    with pytest.raises(EngineError, match="both move slots"):
        EngineConfig(model=Path("m.gguf"), policy="hybrid", repick_every=4)   # type: ignore[arg-type]


def test_chat_negative_slots_is_one_line(tiny_glm: Path) -> None:
    _one_line_error(run("chat", str(tiny_glm), "--slots", "-1"), "--slots -1", "not negative")
