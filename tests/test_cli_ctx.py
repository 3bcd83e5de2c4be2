"""`--ctx`: it has help text; without it `moeslots chat MODEL` and `moeslots` alone open the context the model was
trained for (engine.window.default_ctx: at most 32768 and what the free memory holds), not a fixed 4096; with it
the user's number wins."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from specs import TINY_GLM

from moeslots import cli
from moeslots.cli import chat, launch
from moeslots.engine import synth


def _chat_parser() -> argparse.ArgumentParser:
    p = cli.build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["chat"]


def test_ctx_has_help_and_defaults_to_the_models_own() -> None:
    act = next(a for a in _chat_parser()._actions if a.dest == "ctx")
    assert act.help and "trained length" in act.help and "32768" in act.help and "free" in act.help
    assert "oldest turns" in act.help                           # what happens when a chat outgrows it
    m = Path("/models/a.gguf")
    p = cli.build_parser()
    assert launch.resolve(m, p.parse_args(["chat", str(m)]), {}).ctx == 0             # 0: sized from the model
    assert launch.resolve(m, p.parse_args(["chat", str(m), "--ctx", "8192"]), {}).ctx == 8192


@pytest.fixture()
def opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The context size of each engine the CLI opens (the app itself not run)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    seen: list[int] = []

    def fake_run_app(eng, name, remember=True, a=None, model=None):
        seen.append(eng.ctx.n_ctx)
        eng.close()
        return 0

    monkeypatch.setattr(chat, "run_app", fake_run_app)
    return seen


def test_chat_and_the_app_open_the_models_context(opened: list[int], models_dir: Path) -> None:
    assert cli.main([]) == 0                       # `moeslots` alone: the bundled model, trained on 2048 tokens
    model = synth.write_model(dataclasses.replace(TINY_GLM, n_ctx=1536), models_dir / "ctx-1536.gguf").path
    flags = ["--threads", "2", "--no-mtp", "--no-auto-profile"]
    assert cli.main(["chat", str(model), *flags]) == 0
    assert cli.main(["chat", str(model), *flags, "--ctx", "1024"]) == 0
    assert opened == [2048, 1536, 1024]
