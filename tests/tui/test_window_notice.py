"""A chat that outgrows the model's context goes on (engine.window drops its oldest turns from the prompt); the chat
pane says so once per chat, when the first reply with turns left out arrives — not before, not at every reply."""

from __future__ import annotations

import dataclasses
from typing import Any

from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until

from moeslots.engine.api import Done
from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.store import Store

NOTICE = "the oldest turns no longer fit the model's context (256 tokens)"


class FullContext(FakeEngine):
    """Replies whose stats say what a 256-token context drops: from the third question of a chat on, the oldest
    turns (messages beyond the newest four) are left out."""

    def chat(self, messages, cancel=None, sampling=None):  # noqa: ANN001, ANN201
        for ev in super().chat(messages, cancel, sampling):
            if isinstance(ev, Done):
                ev = Done(dataclasses.replace(ev.stats, dropped=max(0, len(messages) - 4), n_ctx=256), ev.text)
            yield ev


async def _ask(app: MoeslotsApp, pilot: Any, text: str) -> None:
    n = len(app.store.messages(app.chat_id))
    app.query_one(Prompt).text = text
    await pilot.press("enter")
    await wait_until(pilot, lambda: not app.busy and len(app.store.messages(app.chat_id)) >= n + 2)


async def test_the_chat_says_once_per_chat_that_its_oldest_turns_left_the_context(store: Store) -> None:
    app = MoeslotsApp(FullContext(), store=store)
    said: list[str] = []
    async with app.run_test(size=(140, 40)) as pilot:
        notify = app.notify

        def spy(message: str, *a: Any, **kw: Any) -> None:
            said.append(str(message))
            notify(message, *a, **kw)

        app.notify = spy  # type: ignore[method-assign]
        told = []
        for i in range(5):
            await _ask(app, pilot, f"question {i}")
            told.append(sum(NOTICE in s for s in said))
        assert told == [0, 0, 1, 1, 1]                 # said when the first turn was left out, and only then
        assert len(store.messages(app.chat_id)) == 10  # the history keeps every turn
        line = next(s for s in said if NOTICE in s)
        assert "they stay in the history but the model no longer sees them" in line
        await pilot.press("ctrl+n")                    # a new chat: said again when it, too, outgrows the context
        await wait_until(pilot, lambda: not store.messages(app.chat_id))
        for i in range(4):
            await _ask(app, pilot, f"again {i}")
        assert sum(NOTICE in s for s in said) == 2
