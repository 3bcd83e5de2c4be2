"""The model picker (F4) against the scripted fake engine: it lists the GGUFs found, switches the app to the chosen
one (old engine closed, new one opened), refuses a dense model, and goes back to the old model when the new one
fails to open."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import pytest
from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from ggufs import write_moe  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until
from textual.widgets import DataTable

from moeslots.engine.machine import hardware
from moeslots.tui.app import MoeslotsApp
from moeslots.tui.screens.models import ModelsScreen, Switching
from moeslots.tui.store import Store


class ClosingEngine(FakeEngine):
    def __init__(self, name: str = "") -> None:
        super().__init__()
        self.name, self.closed = name, False
        self.notices = [f"opened {name}"]

    def close(self) -> None:
        self.closed = True


@pytest.fixture()
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "models"
    write_moe(d / "alpha.gguf")
    write_moe(d / "beta.gguf", n_expert=16, k=4)
    write_moe(d / "dense.gguf", arch="llama", dense=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))            # no real HF cache / LM Studio folders
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hardware, "probe_gpus", lambda: [])
    return d


_wait = functools.partial(wait_until, timeout=10.0, step=0.05)


def _app(store: Store, models: Path, opener) -> tuple[MoeslotsApp, ClosingEngine]:  # noqa: ANN001
    eng = ClosingEngine("alpha")
    app = MoeslotsApp(eng, store=store, model_name="alpha.gguf")
    app.model_path, app.model_dirs, app.opener = models / "alpha.gguf", [str(models)], opener
    return app, eng


async def _pick(app: MoeslotsApp, pilot, name: str) -> tuple[ModelsScreen, list[list[str]]]:  # noqa: ANN001
    """F4, wait for the list, Enter on `name`; returns the screen and its rows as text (read before Enter)."""
    await pilot.press("f4")
    await _wait(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.survey is not None)
    screen = app.screen
    assert isinstance(screen, ModelsScreen) and screen.survey is not None
    table = screen.query_one(DataTable)
    cells = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
    row = next(i for i, (m, _) in enumerate(screen.survey.models) if m.found.path.name == name)
    table.move_cursor(row=row)
    await pilot.press("enter")
    await pilot.pause(0.1)
    return screen, cells


async def test_picker_lists_and_switches(tmp_path: Path, models: Path) -> None:
    opened: list[Path] = []
    go = threading.Event()

    def opener(p: Path, progress: object = None) -> ClosingEngine:
        opened.append(p)
        go.wait(10)
        return ClosingEngine(p.stem)

    app, old = _app(Store(tmp_path / "c.sqlite"), models, opener)
    async with app.run_test(size=(140, 40)) as pilot:
        _, cells = await _pick(app, pilot, "beta.gguf")
        assert len(cells) == 4 and cells[0][1] == "moeslots-tiny-glm4moe.gguf (bundled)"    # always offered
        assert any(r[0] == "●" and r[1] == "alpha.gguf" for r in cells)                   # the model in use
        assert any(r[1] == "beta.gguf" and r[4] == "16 (k=4)" and r[3] == "qwen3moe" for r in cells)
        await _wait(pilot, lambda: bool(opened))
        assert isinstance(app.engine, Switching) and app.busy and old.closed    # meanwhile: busy, no model
        app.refresh_inspector()                                                      # draws, does not raise
        app.action_slots()
        await pilot.pause(0.1)
        go.set()
        await _wait(pilot, lambda: app.model_path == models / "beta.gguf")
        assert not app.busy
        assert opened == [models / "beta.gguf"] and old.closed
        assert isinstance(app.engine, ClosingEngine) and app.engine.name == "beta"
        await _wait(pilot, lambda: app.store.model_of(app.chat_id) == "beta.gguf")     # its own chat, not alpha's
        assert app.sub_title.startswith("beta.gguf") and not isinstance(app.screen, ModelsScreen)
        # the new engine's notices are shown at the end of the switch handler, after its chat is stored
        await _wait(pilot, lambda: app.engine_actions.notices_seen == 1)


async def test_picker_refuses_a_dense_model(tmp_path: Path, models: Path) -> None:
    app, old = _app(Store(tmp_path / "c.sqlite"), models, lambda p: ClosingEngine(p.stem))
    async with app.run_test(size=(140, 40)) as pilot:
        screen, _ = await _pick(app, pilot, "dense.gguf")
        assert app.screen is screen and not old.closed                  # still open, nothing switched
        assert "dense model" in str(screen.query_one("#models-status").render())
        await pilot.press("escape")
        await _wait(pilot, lambda: not isinstance(app.screen, ModelsScreen))
        assert app.engine is old


async def test_a_model_that_fails_to_open_brings_the_old_one_back(tmp_path: Path, models: Path) -> None:
    calls: list[Path] = []

    def opener(p: Path, progress: object = None) -> ClosingEngine:
        calls.append(p)
        if p.name == "beta.gguf":
            raise RuntimeError("llama.cpp refused it")
        return ClosingEngine(p.stem)

    app, old = _app(Store(tmp_path / "c.sqlite"), models, opener)
    async with app.run_test(size=(140, 40)) as pilot:
        await _pick(app, pilot, "beta.gguf")
        await _wait(pilot, lambda: len(calls) == 2 and isinstance(app.engine, ClosingEngine) and app.engine is not old)
        assert calls == [models / "beta.gguf", models / "alpha.gguf"] and old.closed
        assert app.model_path == models / "alpha.gguf" and app.engine.name == "alpha"


async def test_notices_that_come_after_a_reply_are_shown(tmp_path: Path) -> None:
    """The automatic profile says what it did after a reply (slots planned, profile saved): the app shows it."""
    from moeslots.tui.app import Prompt

    class Noting(ClosingEngine):
        def chat(self, messages, cancel=None, sampling=None):  # noqa: ANN001, ANN202
            yield from super().chat(messages, cancel, sampling)
            self.notices.append("slots planned from your first prompt: 4 of 16 per layer")

    store = Store(tmp_path / "c.sqlite")
    app = MoeslotsApp(Noting("alpha"), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        app.query_one(Prompt).text = "hi"
        await pilot.press("enter")
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 2 and not app.busy)
        shown = [n.message for n in app._notifications]
        assert shown.count("opened alpha") == 1                            # at start, once
        assert "slots planned from your first prompt: 4 of 16 per layer" in shown
