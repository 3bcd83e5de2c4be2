"""Streaming a reply: finished Markdown blocks are found once whatever the chunking, the live tail re-wraps only
the line being written, and the app updates the screen at a bounded rate however fast tokens come."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fakes import FastEngine  # noqa: I001  (tests/ is on sys.path)
from hypothesis import given, settings
from hypothesis import strategies as hs

from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.store import Store
from moeslots.tui.stream import STREAM_EVERY, BlockSplitter, LiveTail, ReplyBuffer, ReplyView

DOC = ("Intro paragraph\nstill intro.\n\n```python\ndef f():\n\n    return 1\n```\nafter the fence\n\n"
       "~~~~\n~~~\nstill code\n~~~~\n- item\n\n- item two\n\nend")


def _cuts(chunks: list[str]) -> tuple[list[str], str]:
    sp = BlockSplitter()
    done = [d for d in (sp.feed(c) for c in chunks) if d]
    return done, sp.tail


def test_blocks_end_at_blank_lines_and_closing_fences() -> None:
    done, tail = _cuts([DOC])
    assert "".join(done) + tail == DOC
    assert done == [DOC[:DOC.rindex("end")]]                  # one feed: everything finished so far at once
    done, tail = _cuts(list(DOC))                              # char by char: each block as it finishes
    assert done == ["Intro paragraph\nstill intro.\n\n", "```python\ndef f():\n\n    return 1\n```\n",
                    "after the fence\n\n", "~~~~\n~~~\nstill code\n~~~~\n", "- item\n\n", "- item two\n\n"]
    assert tail == "end"


@settings(max_examples=60, deadline=None)
@given(hs.lists(hs.integers(0, len(DOC)), max_size=12))
def test_any_chunking_finds_the_same_blocks(points: list[int]) -> None:
    cuts = sorted(set(points))
    chunks = [DOC[a:b] for a, b in zip([0, *cuts], [*cuts, len(DOC)])]
    done, tail = _cuts(chunks)
    ref, ref_tail = _cuts(list(DOC))
    assert "".join(done) == "".join(ref) and tail == ref_tail


def test_reply_buffer_takes_everything_once() -> None:
    b = ReplyBuffer()
    for w in ("a", "b", "c"):
        b.put(w)
    assert b.take() == "abc" and b.take() == ""


class FakeMarkdown:
    def __init__(self) -> None:
        self.appended: list[str] = []
        self.final = ""

    async def append(self, text: str) -> None:
        self.appended.append(text)

    async def update(self, text: str) -> None:
        self.final = text


async def test_live_tail_rewraps_only_the_open_line(monkeypatch) -> None:  # noqa: ANN001
    from textual.app import App, ComposeResult

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield LiveTail()

    app = One()
    async with app.run_test(size=(40, 20)) as pilot:
        tail = app.query_one(LiveTail)
        tail.append("x" * 100 + "\n")
        await pilot.pause()
        assert tail.row_count == 3 + 1                          # 100 chars in 40 columns, and the empty open line
        assert tail.render_line(0).text == "x" * 40
        for i in range(300):
            tail.append(f"line {i} is here\n")
        calls: list[str] = []
        wrap = LiveTail._wrap
        monkeypatch.setattr(LiveTail, "_wrap", lambda self, line: calls.append(line) or wrap(self, line))
        tail.append("one more")
        tail.append(" word\nand")
        tail.append(" so on")
        assert calls == ["one more", "one more word", "and", "and so on"]   # 300 finished lines: none again
        assert tail.text.endswith("line 299 is here\none more word\nand so on")
        view = ReplyView(FakeMarkdown(), tail)
        tail.reset()
        await view.write("para one\n\nopen ")
        await view.write("block")
        assert view.markdown.appended == ["para one\n\n"] and tail.text == "open block"
        await view.finish("para one\n\nopen block")
        assert view.markdown.final == "para one\n\nopen block" and not tail.display
        await view.write("late")                                # a write after the end shows nothing
        assert view.markdown.appended == ["para one\n\n"] and tail.text == ""


async def test_the_app_updates_at_a_bounded_rate(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    writes: list[int] = []
    orig = ReplyView.write

    async def counting(self, text: str) -> None:  # noqa: ANN001
        writes.append(len(text))
        await orig(self, text)

    monkeypatch.setattr(ReplyView, "write", counting)
    eng = FastEngine(4000)
    app = MoeslotsApp(eng, store=Store(tmp_path / "c.sqlite"))  # type: ignore[arg-type]
    async with app.run_test(size=(140, 40)) as pilot:
        app.query_one(Prompt).text = "go"
        t0 = time.monotonic()
        await pilot.press("enter")
        while app.last_turn is None or app.busy:
            await pilot.pause(0.05)
            assert time.monotonic() - t0 < 60
        took = time.monotonic() - t0
        assert app.store.messages(app.chat_id)[-1][1].startswith("w0 w1 ")
        assert len(app.store.messages(app.chat_id)[-1][1].split()) == 4000
    assert len(writes) <= took / STREAM_EVERY + 2, (len(writes), took)   # 4000 tokens, a handful of updates


def test_pacer_keeps_the_ui_within_its_budget() -> None:
    """Updates every STREAM_EVERY while they are cheap; further apart as the UI's CPU time per interval grows, so
    its share stays near the budget; never beyond STREAM_SLOWEST."""
    from moeslots.tui.stream import STREAM_SLOWEST, Pacer

    cpu = [0.0]
    p = Pacer(budget=0.1, cpu=lambda: cpu[0])

    def interval(cost: float, background: float = 0.0) -> float:
        d = STREAM_EVERY
        for _ in range(30):                      # each interval: one update's cost, plus background UI work
            cpu[0] += cost + background * d
            d = p.next_delay()
        return d

    assert interval(0.005) == STREAM_EVERY                       # 5 ms redraws: 10 a second
    assert interval(0.03) == pytest.approx(0.3, rel=0.05)        # 30 ms: ~3 a second, 10 % of a core
    assert interval(0.02, background=0.05) == pytest.approx(0.4, rel=0.05)   # inspector etc. count too
    assert interval(0.2) == STREAM_SLOWEST
    p.start()                                                    # a new reply forgets the last one's cost
    cpu[0] += 0.001
    assert p.next_delay() == STREAM_EVERY
