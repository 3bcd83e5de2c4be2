"""A chat belongs to the model it was made with: the app opens this model's last chat (not the last chat of another
model), the chat list shows each chat's model, and a history from before models were kept opens as before."""

from __future__ import annotations

from pathlib import Path

from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until
from textual.widgets import DataTable

from moeslots.tui.app import MoeslotsApp
from moeslots.tui.store import Store


def test_each_model_continues_its_own_chat(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.sqlite")
    a = store.new_chat(model="alpha.gguf")
    store.add(a, "user", "asked alpha")
    b_app = MoeslotsApp(FakeEngine(), store=store, model_name="beta.gguf")
    assert b_app.chat_id != a and store.model_of(b_app.chat_id) == "beta.gguf"      # not alpha's chat
    store.add(b_app.chat_id, "user", "asked beta")
    assert MoeslotsApp(FakeEngine(), store=store, model_name="alpha.gguf").chat_id == a
    assert MoeslotsApp(FakeEngine(), store=store, model_name="beta.gguf").chat_id == b_app.chat_id


async def test_the_chat_list_shows_the_model(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.sqlite")
    for m in ("alpha.gguf", "beta.gguf"):
        c = store.new_chat(model=m)
        store.add(c, "user", f"asked {m}")
        store.add(c, "assistant", "answered")
    app = MoeslotsApp(FakeEngine(), store=store, model_name="beta.gguf")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+l")
        await wait_until(pilot, lambda: bool(app.screen.query(DataTable))
                         and app.screen.query_one(DataTable).row_count == 2)
        t = app.screen.query_one(DataTable)
        models = sorted(str(t.get_row_at(i)[2]) for i in range(t.row_count))
        assert models == ["alpha", "beta"]
