"""The app against a scripted fake engine (UI behaviour) and once against the real engine on a tiny model."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until

from moeslots.engine.api import Snapshot
from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.screens.modals import SlotsScreen
from moeslots.tui.store import Store
from moeslots.tui.widgets.heatmap import SlotHeatmap

_wait = functools.partial(wait_until, timeout=5.0, step=0.05)


async def test_send_streams_and_persists(store: Store) -> None:
    eng = FakeEngine()
    app = MoeslotsApp(eng, store=store, model_name="fake.gguf")
    async with app.run_test(size=(140, 40)) as pilot:
        app.query_one(Prompt).text = "hi there"
        await pilot.press("enter")
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 2)
        assert store.messages(app.chat_id) == [("user", "hi there"), ("assistant", eng.reply)]
        assert app.query_one(Prompt).text == ""
        assert eng.seen[0][-1].content == "hi there"
    # reopened on the same model: its chat is back
    app2 = MoeslotsApp(FakeEngine(), store=store, model_name="fake.gguf")
    async with app2.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        assert len(list(app2.query("ChatMessage"))) == 2


async def test_shift_enter_and_ctrl_j_insert_newlines(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("a", "ctrl+j", "b")
        assert app.query_one(Prompt).text == "a\nb"
        assert store.messages(app.chat_id) == []


async def test_escape_stops_and_restores_the_prompt(store: Store) -> None:
    eng = FakeEngine(reply=" ".join(["word"] * 200), delay=0.02)
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        app.query_one(Prompt).text = "long answer please"
        await pilot.press("enter")
        await pilot.pause(0.15)
        await pilot.press("escape")
        await _wait(pilot, lambda: not app.busy)
        msgs = store.messages(app.chat_id)
        assert msgs[0] == ("user", "long answer please")
        assert len(msgs) == 2 and 0 < len(msgs[1][1].split()) < 200      # the partial answer is kept
        assert app.query_one(Prompt).text == "long answer please"       # and the prompt is back


async def test_escape_before_any_text_takes_the_question_back(store: Store) -> None:
    eng = FakeEngine(reply="x", delay=0.5)
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        app.query_one(Prompt).text = "never mind"
        await pilot.press("enter")
        await _wait(pilot, lambda: app.busy)
        await pilot.press("escape")
        await _wait(pilot, lambda: not app.busy)
        assert store.messages(app.chat_id) == []
        assert app.query_one(Prompt).text == "never mind"
        assert not list(app.query("ChatMessage"))


async def test_slots_modal_applies_and_errors_keep_state(store: Store) -> None:
    """The dialog applies the value and closes with the new load line; every refusal (not a number, out of range,
    the engine's own) is one line in the dialog, which stays open with the slots unchanged."""
    eng = FakeEngine(n_expert=128)
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "fits up to 12" in str(app.screen.query_one("#slots-info").render())
        inp = app.screen.query_one("#slots-input")
        inp.value = "8"
        await pilot.press("enter")
        await _wait(pilot, lambda: eng.slots == 8 and not isinstance(app.screen, SlotsScreen))
        assert any("x 8 slots" in str(n.message) for n in app._notifications)
        await pilot.press("ctrl+s")
        await pilot.pause()
        for value, said in (("99", "slots unchanged: 99 slots per layer do not fit: 9.9 GiB needed, 2.0 GiB free"),
                            ("lots", "slots unchanged: 'lots' is not a slot count: type a whole number (0 to 128) "
                                     "or auto"),
                            ("-1", "slots unchanged: -1: a slot count is not negative; type 0 to 128 (0: no "
                                   "slots), or auto"),
                            ("129", "slots unchanged: 129 slots per layer: the model has 128 experts per layer; "
                                    "type 0 to 128, or auto")):
            app.screen.query_one("#slots-input").value = value
            await pilot.press("enter")
            await _wait(pilot, lambda: str(app.screen.query_one("#error").render()) != "")
            assert str(app.screen.query_one("#error").render()) == said
            assert isinstance(app.screen, SlotsScreen) and eng.slots == 8        # open, state kept
            app.screen.query_one("#error").update("")
        assert not [n for n in app._notifications if n.severity == "error"]      # no toast disagreeing
        await pilot.press("escape")
        assert not isinstance(app.screen, SlotsScreen)


async def test_record_toggle_saves_a_profile(store: Store, tmp_path: Path) -> None:
    eng = FakeEngine()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("ctrl+r")
        await pilot.pause(0.4)
        assert eng.recording and "REC" in app.title
        await pilot.press("ctrl+r")
        await pilot.pause()
        app.screen.query_one("#name-input").value = str(tmp_path / "mine.csv")
        await pilot.press("enter")
        await _wait(pilot, lambda: not eng.recording)
        assert (tmp_path / "mine.csv").exists()
        await pilot.pause(0.2)                                   # "apply this profile now?" -> the Apply button
        assert "Apply mine.csv to the slots now?" in str(app.screen.query_one("#question").render())
        await pilot.press("enter")
        await _wait(pilot, lambda: getattr(eng, "profile", None) == tmp_path / "mine.csv")
        await _wait(pilot, lambda: eng.load_line.endswith("x 4 slots"))


async def test_inspector_draws_snapshot_and_hides(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.4)
        hm = app.query_one(SlotHeatmap)
        assert len(hm._rows) == 2 and hm._rows[0][1] == (0, 1, 2, 3)
        assert "what-if @4" in str(app.query_one("#whatif").render())
        assert app.query_one("#inspector").display
        await pilot.press("ctrl+t")
        assert not app.query_one("#inspector").display


async def test_narrow_terminal_hides_the_inspector(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not app.query_one("#inspector").display


async def test_keys_are_rebindable(store: Store) -> None:
    eng = FakeEngine()
    app = MoeslotsApp(eng, store=store, keymap={"record": "ctrl+g"})
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("ctrl+g")
        await pilot.pause(0.3)
        assert eng.recording


async def test_real_engine_chat(tiny_glm: Path, store: Store) -> None:
    from moeslots.engine.runtime.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, max_tokens=16))
    app = MoeslotsApp(eng, store=store, model_name=tiny_glm.name)
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            app.query_one(Prompt).text = "hello"
            await pilot.press("enter")
            await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 2, timeout=20)
            await pilot.pause(0.4)
            assert app.query_one("#toks").value != "0.0"
    finally:
        eng.close()


def test_control_characters_never_reach_the_terminal() -> None:
    from moeslots.tui.app import printable

    assert printable("a\x1b[2Jb\x07c\rd\n\te\x7f") == "a\ufffd[2Jb\ufffdc\ufffdd\n\te\ufffd"


async def test_system_prompt_is_editable_and_sent(store: Store) -> None:
    eng = FakeEngine()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("f2")
        await pilot.pause()
        app.screen.query_one("#name-input").value = "You are terse."
        await pilot.press("enter")
        await pilot.pause()
        app.query_one(Prompt).text = "hi"
        await pilot.press("enter")
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 2)
        assert eng.seen[0][0].role == "system" and eng.seen[0][0].content == "You are terse."


async def test_new_chat_clears_the_log(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        app.query_one(Prompt).text = "first"
        await pilot.press("enter")
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 2)
        old = app.chat_id
        await pilot.press("ctrl+n")
        await pilot.pause(0.2)
        assert app.chat_id != old and not list(app.query("ChatMessage"))
        assert len(store.messages(old)) == 2


async def test_repick_toggle(store: Store) -> None:
    class RepickFake(FakeEngine):
        def snapshot(self) -> Snapshot:
            snap = super().snapshot()
            if not self.repick_every:
                return snap
            return dataclasses.replace(snap, repicks=3, repick_swaps=12, repick_mb=30.0)

    eng = RepickFake()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("f3")
        assert eng.repick_every == 16
        await pilot.pause(0.6)                                    # a snapshot refresh
        assert "re-picks 3: 12 swaps, 30 MB (10.0 MB each)" in str(app.query_one("#whatif").render())
        await pilot.press("f3")
        assert eng.repick_every == 0


async def test_repick_auto_switch_is_said(store: Store) -> None:
    """`--repick auto` decides again after replies: when its interval changes the app says why (a toast) and
    the inspector shows the interval in force; a reply that changes nothing says nothing."""
    class AutoFake(FakeEngine):
        def __init__(self) -> None:
            super().__init__()
            self.decisions = [(0, "auto: static: 40 % hits"), (16, "auto @256 tokens, static -> re-pick every 16"),
                              (16, "auto @512 tokens: re-pick every 16")]
            self.auto = self.decisions[0][1]

        def chat(self, messages, cancel=None, sampling=None):  # noqa: ANN001
            yield from super().chat(messages, cancel, sampling)
            self.decisions.pop(0)
            self.repick_every, self.auto = self.decisions[0]

        def snapshot(self) -> Snapshot:
            return dataclasses.replace(super().snapshot(), repick_auto=self.auto)

    eng = AutoFake()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.4)
        assert "auto: static" in str(app.query_one("#profile").render())
        for ask, said in (("one", 1), ("two", 1)):
            app.query_one(Prompt).text = ask
            await pilot.press("enter")
            await _wait(pilot, lambda: not app.busy and len(store.messages(app.chat_id)) >= 2)
            await pilot.pause(0.4)
            toasts = [n.message for n in app._notifications if "re-pick every 16" in str(n.message)]
            assert len(toasts) == said, toasts
        assert "auto: re-pick every 16" in str(app.query_one("#profile").render())


async def test_inspector_touches_only_what_changed_and_shows_the_mtp_state(store: Store) -> None:
    from moeslots.tui.inspector import Inspector

    class MTPFake(FakeEngine):
        line = ""

        def snapshot(self) -> Snapshot:
            return dataclasses.replace(super().snapshot(), mtp_line=self.line)

    eng = MTPFake()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.4)
        insp = app.query_one(Inspector)
        assert not app.query_one("#mtp").display and "MTP accept 0.70" in str(app.query_one("#prompt-speed").render())
        n = insp.updates
        app._draw_inspector()
        app._draw_inspector()
        assert insp.updates == n                                  # the same snapshot: nothing redrawn
        eng.line = "MTP off (accept 12 % < 35 %; probe in 64 tokens)"
        app._draw_inspector()
        await pilot.pause()
        assert insp.updates == n + 2                              # the MTP line, and the prompt line without it
        assert app.query_one("#mtp").display
        assert "MTP off (accept 12 % < 35 %" in str(app.query_one("#mtp").render())
        assert "MTP accept" not in str(app.query_one("#prompt-speed").render())


async def test_the_inspector_says_when_a_turn_re_read_the_chat(store: Store) -> None:
    """Hybrid models resume a follow-up turn from a recurrent checkpoint; when none fits, the turn reads the whole
    chat again, and the prompt line says so (and stops saying it once a turn resumes again)."""

    class RereadFake(FakeEngine):
        reread = True

        def snapshot(self) -> Snapshot:
            return dataclasses.replace(super().snapshot(), reread=self.reread)

    eng = RereadFake()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.4)
        assert "re-read the whole chat" in str(app.query_one("#prompt-speed").render())
        eng.reread = False
        app._draw_inspector()
        await pilot.pause()
        assert "re-read" not in str(app.query_one("#prompt-speed").render())
