"""Issue 22, the chat: what a new user tripped over (prompts merging after Esc, Enter refused while stopping, text
lost after `<?`, doctest lines as quotes, the chat no longer following the reply, Ctrl+E/Ctrl+Y dead in the prompt
box) and what oterm/elia users expect (regenerate, edit the last question, copy code blocks, a welcome text).
Each test failed on the code before the fix (see the commit message)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until
from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownBlock, MarkdownBlockQuote, MarkdownFence

from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.store import Store

_wait = wait_until


async def _ask(app: MoeslotsApp, pilot, text: str) -> None:  # noqa: ANN001
    n = len(app.store.messages(app.chat_id))
    app.query_one(Prompt).text = text
    await pilot.press("enter")
    await _wait(pilot, lambda: not app.busy and len(app.store.messages(app.chat_id)) >= n + 2)


def _shown_text(app: MoeslotsApp) -> str:
    """The text the last message's Markdown blocks draw."""
    md = list(app.query(Markdown))[-1]
    return "\n".join(str(b.render()) for b in md.query(MarkdownBlock))


async def test_esc_before_the_first_token_gives_the_question_back_selected(store: Store) -> None:
    """The question comes back selected, the cursor at its end: what is typed next replaces it instead of going
    in front of it (`round 2round 1` sent as one)."""
    app = MoeslotsApp(FakeEngine(prefill=1.5), store=store)        # (a window the pilot sees under load)
    async with app.run_test(size=(140, 40)) as pilot:
        app.query_one(Prompt).text = "round 1"
        await pilot.press("enter")
        await _wait(pilot, lambda: app.busy)
        await pilot.press("escape")
        await _wait(pilot, lambda: not app.busy)
        assert store.messages(app.chat_id) == [] and app.query_one(Prompt).text == "round 1"
        await pilot.press(*"round 2")
        assert app.query_one(Prompt).text == "round 2"
        await pilot.press("enter")
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 2)
        assert store.messages(app.chat_id)[0] == ("user", "round 2")


async def test_enter_while_stopping_sends_once_stopped(store: Store) -> None:
    """Esc, then a new question and Enter while the engine is still reading the old prompt (it looks at the stop
    only afterwards): the new question is sent once the old reply has stopped; the old one is gone, not merged."""
    eng = FakeEngine(prefill=0.5)
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        app.query_one(Prompt).text = "round 1"
        await pilot.press("enter")
        await _wait(pilot, lambda: app.busy)
        assert app.query_one(Prompt).border_title == "answering… Esc: stop"     # the box says Enter is refused
        await pilot.press("escape")
        app.query_one(Prompt).text = "round 2"
        assert app.busy                                                  # still stopping
        assert app.query_one(Prompt).border_title == "stopping… Enter: send when stopped"
        await pilot.press("enter")
        assert app.query_one(Prompt).text == ""                                 # taken, not refused
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 2 and not app.busy)
        assert store.messages(app.chat_id) == [("user", "round 2"), ("assistant", eng.reply)]
        assert app.query_one(Prompt).text == "" and not app.query_one(Prompt).border_title
        assert not [n for n in app._notifications if "still answering" in str(n.message)]


async def test_raw_html_like_text_stays_visible(store: Store) -> None:
    reply = "Start here.\n\n<?xml is how an XML file begins\n\n<div> too\n\nThe rest of the answer."
    app = MoeslotsApp(FakeEngine(reply=reply), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await _ask(app, pilot, "xml?")
        await pilot.pause(0.1)
        shown = _shown_text(app)
        assert "<?xml is how an XML file begins" in shown and "<div> too" in shown
        assert "The rest of the answer." in shown


async def test_doctest_lines_are_a_code_block_not_quotes(store: Store) -> None:
    reply = "Like this:\n\n>>> 1 + 1\n2\n>>> print('x')\nx\n\nDone."
    app = MoeslotsApp(FakeEngine(reply=reply), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await _ask(app, pilot, "doctest?")
        await pilot.pause(0.1)
        md = list(app.query(Markdown))[-1]
        assert not md.query(MarkdownBlockQuote)
        fences = list(md.query(MarkdownFence))
        assert len(fences) == 1 and fences[0].code == ">>> 1 + 1\n2\n>>> print('x')\nx"
        assert store.messages(app.chat_id)[-1][1] == reply                     # stored as the model said it


async def test_the_chat_follows_the_reply_after_a_dialog_and_the_inspector_toggle(store: Store) -> None:
    reply = " ".join(f"word{i}" + ("\n\n" if i % 8 == 7 else "") for i in range(240))
    eng = FakeEngine(reply=reply, delay=0.004)
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 30)) as pilot:
        log = app.query_one("#chat-log")
        app.query_one(Prompt).text = "a long one"
        await pilot.press("enter")
        await _wait(pilot, lambda: log.max_scroll_y > 5)
        await pilot.press("f2")                                         # a dialog over the streaming reply
        await pilot.pause(0.3)
        await pilot.press("escape")
        await pilot.pause(0.2)
        await pilot.press("ctrl+t")
        await pilot.pause(0.2)
        await pilot.press("ctrl+t")
        await _wait(pilot, lambda: not app.busy)
        await pilot.pause(0.3)
        assert log.max_scroll_y > 20 and log.scroll_y == log.max_scroll_y      # at the bottom: it followed
        log.scroll_to(y=0, animate=False)                                      # the user scrolls up: no longer
        await pilot.pause(0.1)                                                 # following
        assert not log.follow


async def test_ctrl_e_and_ctrl_y_work_from_the_prompt_box(store: Store, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    eng = FakeEngine()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await _ask(app, pilot, "hi")
        assert app.focused is app.query_one(Prompt)
        await pilot.press("ctrl+y")
        assert app.clipboard == eng.reply
        await pilot.press("ctrl+e")
        out = tmp_path / "data" / "moeslots" / "exports" / f"chat-{app.chat_id}.md"
        assert out.exists() and eng.reply in out.read_text()


async def test_regenerate_replaces_the_last_answer(store: Store) -> None:
    class Counting(FakeEngine):
        def chat(self, messages, cancel=None, sampling=None):  # noqa: ANN001, ANN202
            self.reply = f"answer number {len(self.seen) + 1}"
            yield from super().chat(messages, cancel, sampling)

    eng = Counting()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("f5")
        assert "nothing to regenerate" in str(list(app._notifications)[-1].message)
        await _ask(app, pilot, "question")
        await pilot.press("f5")
        await _wait(pilot, lambda: len(eng.seen) == 2 and not app.busy)
        assert store.messages(app.chat_id) == [("user", "question"), ("assistant", "answer number 2")]
        assert [m.content for m in eng.seen[1]] == ["question"]                 # asked again, without the old one
        shown = [(m.role, m.text) for m in app.query("ChatMessage")]
        assert [r for r, _ in shown] == ["user", "assistant"] and "answer number 2" in _shown_text(app)


async def test_edit_last_takes_the_question_back(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await _ask(app, pilot, "first")
        await _ask(app, pilot, "second with a typo")
        await pilot.press("f6")
        await pilot.pause()
        assert [r for r, _ in store.messages(app.chat_id)] == ["user", "assistant"]
        assert len(app.query("ChatMessage")) == 2
        prompt = app.query_one(Prompt)
        assert prompt.text == "second with a typo" and prompt.selected_text == "second with a typo"
        await pilot.press("end", *" fixed", "enter")
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 4 and not app.busy)
        assert store.messages(app.chat_id)[2] == ("user", "second with a typo fixed")


async def test_code_blocks_can_be_copied(store: Store) -> None:
    reply = "Two blocks:\n\n```python\nx = 1\n```\n\nand\n\n```python\ndef f():\n    return 2\n```\n\nend"
    app = MoeslotsApp(FakeEngine(reply=reply), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await _ask(app, pilot, "code please")
        await pilot.pause(0.1)
        await pilot.press("ctrl+b")                                     # the last block of the last answer
        assert app.clipboard == "def f():\n    return 2"
        first = list(app.query(MarkdownFence))[0]
        await pilot.click(first)                                        # or click any block
        assert app.clipboard == "x = 1"
        assert "code block copied (1 line)" in str(list(app._notifications)[-1].message)


async def test_an_empty_chat_says_what_the_app_is_and_the_keys(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store, model_name="tiny.gguf", keymap={"stop": "ctrl+x"})
    async with app.run_test(size=(140, 40)) as pilot:
        welcome = str(app.query_one("#welcome").render())
        for needle in ("tiny.gguf", "Mixture-of-Experts", "Enter", "Ctrl+X", "F1", "fake-profile.csv"):
            assert needle in welcome, needle
        await _ask(app, pilot, "hi")
        assert not app.query("#welcome")
        await pilot.press("ctrl+n")
        await _wait(pilot, lambda: bool(app.query("#welcome")))
