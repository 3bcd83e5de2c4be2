"""Issue 22, the inspector: the heatmap fits 256 slots x 48 layers with the miss column on screen, hover names what
a (merged) cell holds, the profile and policy are named, a legend and tooltips explain it, values measured at
another slot count are marked stale, the slots dialog wraps and says every refusal in one place, and the inspector
follows the terminal's width both ways. Each test failed on the code before the fix."""

from __future__ import annotations

import dataclasses
import re

import pytest
from fakes import FakeEngine  # noqa: I001  (tests/ is on sys.path)
from pilot import wait_until

from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.store import Store
from moeslots.tui.widgets.heatmap import SlotHeatmap

_wait = wait_until


def _text(app: MoeslotsApp, wid: str) -> str:
    return str(app.query_one(wid).render())


@pytest.mark.parametrize("slots", [32, 64, 256])
async def test_the_heatmap_fits_any_slot_count_and_keeps_the_miss_column(store: Store, slots: int) -> None:
    eng = FakeEngine(slots=slots, layers=48, n_expert=max(64, slots))
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.4)
        hm = app.query_one(SlotHeatmap)
        misses = {ls.layer: ls.recent_miss_share for ls in eng.snapshot().layers}
        rows = [hm.render_line(y).text for y in range(hm.size.height)]
        shown = [r for r in rows if r.startswith("L")]
        assert len(shown) >= 10
        for r in shown:                                      # every visible row shows its layer's miss share
            assert re.search(rf"(?<![0-9]){100 * misses[int(r[1:3])]:.0f} ?%", r), r
        assert all(hm.render_line(y).cell_length == hm.size.width for y in range(hm.size.height))
        for r in shown:                                      # right after the label, before the cells
            assert f"{100 * misses[int(r[1:3])]:.0f}%" in r[:hm.scale.cells_x], r
        cells = hm.scale.groups * hm.scale.cw
        assert hm.scale.cells_x + cells <= hm.size.width     # no cell past the edge
        if slots == 256:
            assert f"{hm.scale.per} per cell" in rows[0] and hm.scale.per > 1
        hm.scroll_end(animate=False)                         # 48 layers scroll under the header
        await pilot.pause(0.1)
        assert hm.render_line(0).text.strip().startswith("miss")
        assert hm.render_line(hm.size.height - 1).text.startswith("L48")


async def test_hover_names_what_a_merged_cell_holds(store: Store) -> None:
    eng = FakeEngine(slots=256, layers=48, n_expert=256)
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.4)
        hm = app.query_one(SlotHeatmap)
        per = hm.scale.per
        ls = eng.snapshot().layers[0]
        text = hm.describe_at(hm.scale.cells_x, 1)
        experts = ", ".join(str(e) for e in ls.slot_experts[:per])
        assert text == (f"layer 1 · {per} slots (0–{per - 1}) · experts {experts} · "
                        f"{sum(ls.slot_hits_recent[:per])} recent hits")
        assert "missed the slots" in (hm.describe_at(hm.scale.label, 1) or "")
        await pilot.hover(hm, offset=(hm.scale.cells_x, 1))
        await pilot.pause(0.1)
        assert _text(app, "#hover") == text


async def test_the_inspector_names_profile_and_policy_and_explains_itself(store: Store) -> None:
    eng = FakeEngine()
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.4)
        assert _text(app, "#profile") == "profile fake-profile.csv · static slots"
        await pilot.press("f3")
        await pilot.pause(0.4)
        assert _text(app, "#profile") == "profile fake-profile.csv · re-pick every 16"
        legend = _text(app, "#legend")
        for needle in ("colour", "miss", "what-if", "MTP a/d", "dim"):
            assert needle in legend, needle
        for wid in ("#heatmap", "#whatif", "#split", "#profile", "#mtp"):
            assert app.query_one(wid).tooltip, wid
        assert "MTP 7/10 drafts accepted" in app.title


async def test_values_measured_at_another_slot_count_are_marked_stale(store: Store) -> None:
    eng = FakeEngine(n_expert=16)
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(160, 48)) as pilot:
        app.query_one(Prompt).text = "hi"
        await pilot.press("enter")
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 2 and not app.busy)
        await pilot.pause(0.3)
        assert "stale" not in _text(app, "#whatif") and not app.query_one("#whatif").has_class("stale")
        await pilot.press("ctrl+s")
        await pilot.pause()
        app.screen.query_one("#slots-input").value = "8"
        await pilot.press("enter")
        await _wait(pilot, lambda: eng.slots == 8)
        await pilot.pause(0.4)
        assert _text(app, "#whatif").startswith("what-if @4: static 60 %  lru 40 %  re-elect 55 % (stale: now 8")
        assert app.query_one("#whatif").has_class("stale")
        assert "(at 4 slots)" in _text(app, "#toks-unit") and app.query_one("#speed").has_class("stale")
        eng.whatif = "what-if @8: static 70 %  lru 50 %  re-elect 60 %"        # the engine's new line
        app.query_one(Prompt).text = "again"
        await pilot.press("enter")
        await _wait(pilot, lambda: len(store.messages(app.chat_id)) == 4 and not app.busy)
        await pilot.pause(0.4)
        assert _text(app, "#whatif") == eng.whatif and not app.query_one("#speed").has_class("stale")


async def test_the_slots_dialog_wraps_and_says_refusals_in_its_own_words(store: Store) -> None:
    eng = FakeEngine(n_expert=64)
    eng.profile = None
    eng.slots_info = lambda: ("one slot per layer = 12.5 MiB; the pack now 200 MiB; the free VRAM holds up to 61 "   # type: ignore[method-assign]
                              "slots per layer (auto), with 1 GiB kept free for the context and the display")
    app = MoeslotsApp(eng, store=store)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        info = app.screen.query_one("#slots-info")
        box = app.screen.query_one("Vertical")
        assert info.region.height >= 2 and info.region.right <= box.region.right       # wrapped inside the box
        app.screen.query_one("#slots-input").value = "8"
        await pilot.press("enter")
        await pilot.pause(0.2)
        said = str(app.screen.query_one("#error").render())
        assert said.startswith("slots unchanged: no profile yet to choose the experts from: record one (Ctrl+R")
        assert "--" not in said and not [n for n in app._notifications if "--" in str(n.message)]
        assert eng.slots == 4


async def test_the_inspector_follows_the_width_both_ways(store: Store) -> None:
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(160, 40)) as pilot:
        insp, chat = app.query_one("#inspector"), app.query_one("#chat-pane")
        assert insp.display
        await pilot.resize_terminal(100, 30)
        await pilot.pause(0.2)
        assert not insp.display and chat.display                 # narrow: hidden
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        assert insp.display and not chat.display and insp.region.width == 100     # shown as a tab
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        assert not insp.display and chat.display and app.focused is app.query_one(Prompt)
        await pilot.resize_terminal(160, 40)
        await pilot.pause(0.2)
        assert insp.display and chat.display                      # wide again: shown beside the chat
        await pilot.press("ctrl+t")
        await pilot.resize_terminal(100, 30)
        await pilot.resize_terminal(160, 40)
        await pilot.pause(0.2)
        assert insp.display                                       # each crossing sets the width's default


class TierEngine(FakeEngine):
    """A snapshot with a dynamic tier in force (engine.native_tier: --policy hybrid)."""

    def snapshot(self):  # noqa: ANN201
        return dataclasses.replace(super().snapshot(), policy="hybrid", tier_slots=2,
                                   policy_line="hybrid: 2 core + 2 tier slots", split_per_token=(3.1, 1.2, 3.7),
                                   tier_uploads_per_token=0.5)


async def test_the_inspector_shows_the_tier_and_the_split_per_token(store: Store) -> None:
    """--policy hybrid|dynamic: the policy line names core and tier, and the picks per token are split three ways
    (slots, tier, CPU) with the misses uploaded into the tier per token; a static cache shows no tier line."""
    app = MoeslotsApp(TierEngine(), store=store)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.4)
        assert _text(app, "#profile") == "profile fake-profile.csv · hybrid: 2 core + 2 tier slots"
        assert _text(app, "#uploads").startswith("per token: slots 3.1 · tier 1.2 · CPU 3.7 experts, 0.50 into the "
                                                 "tier\nuploaded/token")
    app = MoeslotsApp(FakeEngine(), store=store)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause(0.4)
        assert "tier" not in _text(app, "#uploads")
