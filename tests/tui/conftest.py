from __future__ import annotations

from pathlib import Path

import pytest

from moeslots.tui.store import Store


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    """A chat history of the test's own."""
    return Store(tmp_path / "chats.sqlite")
