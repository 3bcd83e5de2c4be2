"""User report item 6 and three smaller ones: the layout at 120 columns and at 80x24, the command palette, a stopped
reply's marker and the export's header. Each test failed on the code before.

- 120x40: the chat keeps at least 70 columns (the inspector took 70 of 120) and a long code line wraps instead of
  being cut at the pane's edge;
- 80x24: the inspector is hidden at start, the welcome text names the key that shows it; start-up notices are one
  line each in the chat pane, not toasts over half the screen; the inspector shown (the toggle key) gives its
  heatmap room for every layer row of a 10-layer model, the rest of the inspector scrolling;
- the command palette (Ctrl+P) lists each action once, its second line saying what it does (it was its name again);
- a reply stopped by Esc ends in "— stopped" on screen and in the history (the model is given its text without it);
- the Markdown export starts with a header: title, model, date, sampling, system prompt.

A reply is held open by a gate the test controls (no timing), as in test_stop_keys_and_live_speed.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until
from textual.command import CommandList, CommandPalette
from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownFence

from moeslots.engine.api import Done, Sampling, TextDelta, TurnStats
from moeslots.tui import keys
from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.store import Store
from moeslots.tui.widgets.chat import ChatMessage
from moeslots.tui.widgets.heatmap import SlotHeatmap

NOTICES = [
    "expert cache: 40 layers x 8 slots, 3.1 GiB uploaded to the GPU, the rest computed on the CPU with 8 threads",
    "residency: static slots chosen from the profile saved for this model, re-picked every 16 tokens",
    "using the profile saved for this model: /home/user/.local/share/moeslots/profiles/qwen3.csv (12000 tokens)",
    "qwen3.gguf has no NextN (MTP) block: decoding without MTP",
]


class GatedEngine(FakeEngine):
    """Says its first `before` words, then holds the reply open until the test sets `gate` (or the reply is
    stopped), then says the rest; `gate` stays set: later replies run straight through."""

    def __init__(self, before: int = 5) -> None:
        super().__init__(reply=" ".join(f"word{i}" for i in range(20)))
        self.before = before
        self.gate = threading.Event()
        self.held = threading.Event()               # set while a reply waits at the gate

    def chat(self, messages, cancel=None, sampling=None) -> Iterator[TextDelta | Done]:  # noqa: ANN001
        self.seen.append(list(messages))
        cancel = cancel or threading.Event()
        out: list[str] = []
        for i, w in enumerate(self.reply.split(" ")):
            if i == self.before:
                self.held.set()
                for _ in range(3000):               # at most 30 s: a test that forgets the gate still ends
                    if self.gate.wait(0.01) or cancel.is_set():
                        break
                self.held.clear()
            if cancel.is_set():
                break
            out.append((" " if i else "") + w)
            yield TextDelta(out[-1])
        yield Done(TurnStats(5, 0.01, len(out), 0.1, cancel.is_set(), 0.5), "".join(out))


async def _wait(pilot, cond) -> None:  # noqa: ANN001
    await wait_until(pilot, cond, timeout=60.0, step=0.05)      # generous: a busy 2-core machine


def _long_code_chat(store: Store) -> None:
    chat = store.new_chat()
    store.add(chat, "user", "one long line of code")
    store.add(chat, "assistant", "here:\n\n```python\nx = " + " + ".join(str(i) for i in range(60)) + "\n```\n")


async def test_the_chat_keeps_the_room_at_120_columns(store: Store) -> None:
    _long_code_chat(store)
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.query_one("#inspector").display                              # shown, beside the chat
        assert app.query_one("#chat-pane").region.width >= 70
        fence = app.query_one(MarkdownFence)
        await _wait(pilot, lambda: fence.size.width > 0)
        assert fence.max_scroll_x == 0 and fence.virtual_size.width <= fence.size.width    # nothing cut off:
        assert fence.size.height >= 4                                                      # the line wraps


async def test_at_80x24_the_inspector_is_hidden_and_the_welcome_names_its_key(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store, keymap={"inspector": "f8"})
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not app.query_one("#inspector").display
        welcome = str(app.query_one("#welcome").render())
        assert "F8 shows it" in welcome and "right" not in welcome                # not "the inspector (right, …)"
        await pilot.press("f8")                                                   # shown in the chat's place
        await pilot.press("f8")
        await pilot.pause()
        assert not app.query_one("#inspector").display and "F8 shows it" in str(app.query_one("#welcome").render())
    wide = MoeslotsApp(FakeEngine(), store=store, keymap={"inspector": "f8"})
    async with wide.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        assert wide.query_one("#inspector").display and "F8 hides it" in str(wide.query_one("#welcome").render())


@pytest.mark.parametrize("size", [(80, 24), (140, 40)], ids=["80x24", "140x40"])
async def test_start_up_notices_do_not_cover_a_small_screen(store: Store, size: tuple[int, int]) -> None:
    """At 80x24 the engine's notices and a keymap warning are one line each at the end of the chat pane (no toast);
    on a large screen they stay toasts."""
    eng = FakeEngine()
    eng.notices = list(NOTICES)
    app = MoeslotsApp(eng, store=store, keymap={"nope": "f12"})
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        if size[0] >= 110:
            assert len(app._notifications) == len(NOTICES) + 1 and not app.query("#notices")
            return
        assert not app._notifications                                            # no toast over the chat
        notes: Any = app.query_one("#notices")                        # (tui.widgets.chat.Notices)
        assert notes.lines[0].startswith("[keymap] nope") and notes.lines[1:] == NOTICES
        assert notes.region.height == len(NOTICES) + 1                           # one line each
        assert notes.region.width <= 80 and notes.region.y + notes.region.height <= 24 - 5     # above the prompt
        await pilot.click("#notices")                                               # a click: whole
        await pilot.pause()
        assert notes.region.height > len(NOTICES) + 1


async def test_the_inspector_on_a_small_screen_shows_its_layer_rows(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(layers=10, slots=8, n_expert=64), store=store)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+t")
        await pilot.pause()
        app.refresh_inspector()
        await pilot.pause()
        heatmap, inspector = app.query_one(SlotHeatmap), app.query_one("#inspector")
        assert inspector.display and heatmap.size.height >= 1 + 10               # its header and 10 layer rows
        assert inspector.max_scroll_y > 0                                        # the rest of the inspector scrolls
        inspector.scroll_end(animate=False)
        await pilot.pause()
        assert inspector.scroll_y > 0


async def test_the_palette_lists_each_action_once(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+p")
        await _wait(pilot, lambda: isinstance(app.screen, CommandPalette)
                    and app.screen.query_one(CommandList).option_count > 0)
        await pilot.pause(0.3)
        options = app.screen.query_one(CommandList)
        prompts = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        titles = [p.split("\n")[0] for p in prompts]
        assert len(titles) == len(set(titles))
        for b in keys.BINDINGS:
            if b.action not in ("quit", "interrupt"):                            # Textual's Quit; Stop for Ctrl+C
                assert titles.count(b.description) == 1, b.description
                help_line = prompts[titles.index(b.description)].partition("\n")[2]
                assert help_line and not help_line.startswith(b.description), help_line     # not its name again
        assert "the chat list: open, rename, delete, search old chats · Ctrl+L" in prompts[titles.index("Chats")]


async def test_a_stopped_reply_carries_a_marker_on_screen_and_in_the_history(store: Store) -> None:
    eng = GatedEngine(before=5)
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        app.query_one(Prompt).text = "tell me"
        await pilot.press("enter")
        await _wait(pilot, lambda: eng.held.is_set())
        await pilot.press("escape")
        await _wait(pilot, lambda: not app.busy)
        said = store.messages(app.chat_id)[-1]
        assert said[0] == "assistant" and said[1].startswith("word0 word1") and said[1].endswith("— stopped*")
        shown = list(app.query(ChatMessage))[-1].query_one(Markdown)
        assert "— stopped" in shown.source
        eng.gate.set()
        app.query_one(Prompt).text = "go on"                  # (Esc gave the question back: replaced)
        await pilot.press("enter")
        await _wait(pilot, lambda: not app.busy and len(store.messages(app.chat_id)) == 4)
        given = [m.content for m in eng.seen[-1] if m.role == "assistant"]
        assert given == ["word0 word1 word2 word3 word4"]     # the model gets its own text, not the marker
        assert not store.messages(app.chat_id)[-1][1].endswith("— stopped*")    # a whole reply: no marker


async def test_the_export_starts_with_a_header(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    chat = store.new_chat("Answer in one line.", Sampling(0.7, 0.9, 42), model="fake-moe.gguf")
    store.add(chat, "user", "what is an LRU cache")
    store.add(chat, "assistant", "It evicts the entry used least recently.")
    app = MoeslotsApp(FakeEngine(), store=store, model_name="fake-moe.gguf")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.chat_id == chat
        await pilot.press("ctrl+e")
        out = tmp_path / "data" / "moeslots" / "exports" / f"chat-{chat}.md"
        await _wait(pilot, out.exists)
    text = out.read_text()
    head, rule, body = text.partition("\n---\n")
    assert rule and head.startswith("# what is an LRU cache\n")
    for line in ("- **model:** fake-moe.gguf", "- **sampling:** T 0.7 · top-p 0.9 · seed 42",
                 "- **system prompt:**", "  > Answer in one line."):
        assert line in head.split("\n"), line
    assert "- **date:** 20" in head
    assert body.index("## user") < body.index("## assistant") and "It evicts the entry" in body
    assert "Answer in one line" not in body                  # said once, in the header
