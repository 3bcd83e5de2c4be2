"""Snapshots of the chat and the inspector drawn from the scripted fake engine (deterministic data)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)

from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.store import Store


def _app(tmp_path: Path, engine: FakeEngine | None = None) -> MoeslotsApp:
    store = Store(tmp_path / "snap.sqlite")
    chat = store.new_chat(model="fake-moe.gguf")
    store.add(chat, "user", "explain the LRU policy in two lines")
    store.add(chat, "assistant", "An **LRU** cache evicts the entry used least recently.\n\nIt bets that what was used "
                                 "a moment ago will be used again soon.")
    return MoeslotsApp(engine or FakeEngine(), store=store, model_name="fake-moe.gguf")


async def _settle(pilot) -> None:  # noqa: ANN001
    pilot.app.query_one(Prompt).cursor_blink = False
    await pilot.pause(0.5)


def test_chat_and_inspector(snap_compare, tmp_path: Path) -> None:  # noqa: ANN001
    assert snap_compare(_app(tmp_path), terminal_size=(140, 36), run_before=_settle)


def test_narrow_terminal(snap_compare, tmp_path: Path) -> None:  # noqa: ANN001
    assert snap_compare(_app(tmp_path), terminal_size=(80, 24), run_before=_settle)


def _big(tmp_path: Path, slots: int) -> MoeslotsApp:
    """A Qwen3.6-sized cache: 48 MoE layers of 256 experts, `slots` of them resident."""
    return _app(tmp_path, FakeEngine(slots=slots, layers=48, n_expert=256))


@pytest.mark.parametrize("size", [(160, 48), (100, 30)], ids=["160x48", "100x30"])
@pytest.mark.parametrize("slots", [16, 64, 256])
def test_the_inspector_at_256_experts(snap_compare, tmp_path: Path, size: tuple[int, int], slots: int) -> None:  # noqa: ANN001
    """The heatmap fits its panel at every slot count (cells merge past the panel's width; the miss column stays)."""
    async def inspector(pilot) -> None:  # noqa: ANN001
        if size[0] < 110:                                         # narrow: Ctrl+T shows the inspector as a tab
            await pilot.press("ctrl+t")
        await _settle(pilot)

    assert snap_compare(_big(tmp_path, slots), terminal_size=size, run_before=inspector)
