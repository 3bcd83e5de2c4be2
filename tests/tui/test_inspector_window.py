"""The inspector states the window its routing figures count (since the slots changed: N tokens) and, against the
real engine, its lines agree after each slot change: the split bar, CPU experts/token, the what-if line and the
heatmap's miss column (a user report: miss 0 % on every layer beside "host 56 %" at 256 of 256 slots). Failed on
the code before: the screen said no window, and the split kept the old slots' figures marked "(at N slots)"."""

from __future__ import annotations

import re
from pathlib import Path

from pilot import wait_until  # noqa: I001  (tests/ is on sys.path)

from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.store import Store
from moeslots.tui.widgets.heatmap import SlotHeatmap

TRUNK, K, N_EXPERT = [1, 2], 4, 16        # tiny_glm: MoE layers 1 and 2, 4 of 16 experts per token


def _text(app: MoeslotsApp, wid: str) -> str:
    return str(app.query_one(wid).render())


def _misses(app: MoeslotsApp) -> list[int]:
    """The heatmap's miss column, in % per layer row."""
    hm = app.query_one(SlotHeatmap)
    rows = [hm.render_line(y).text for y in range(hm.size.height)]
    return [int(m.group(1)) for r in rows if (m := re.match(r"L\d+\s+(\d+)%", r))]


def _host(app: MoeslotsApp) -> int:
    m = re.search(r"host\s+(\d+) %", _text(app, "#split"))
    assert m, _text(app, "#split")
    return int(m.group(1))


def _cpu(app: MoeslotsApp) -> float:
    m = re.search(r"CPU experts/token ([\d.]+)", _text(app, "#uploads"))
    assert m, _text(app, "#uploads")
    return float(m.group(1))


async def test_the_inspector_states_the_window_and_its_figures_agree(tiny_glm: Path, store: Store) -> None:
    from moeslots.engine.runtime.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, max_tokens=24, mtp=True,
                              mtp_auto=False, slots=SlotPlan.uniform(TRUNK, 6, N_EXPERT)))
    app = MoeslotsApp(eng, store=store, model_name=tiny_glm.name)

    async def reply(pilot, ask: str) -> None:  # noqa: ANN001
        n = len(store.messages(app.chat_id))
        app.query_one(Prompt).text = ask
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(store.messages(app.chat_id)) == n + 2 and not app.busy, 20)

    async def shown(pilot, line: str) -> None:  # noqa: ANN001
        app.refresh_inspector()
        await wait_until(pilot, lambda: _text(app, "#window") == line, 10)
        await pilot.pause(0.1)

    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await reply(pilot, "tell me about the experts")
            n = eng.snapshot().window_tokens          # type: ignore[attr-defined]  (engine.window_stats)
            assert n >= 24
            await shown(pilot, f"since the slots changed: {n} tokens")
            assert app.query_one("#window").display and app.query_one("#window").tooltip

            eng.set_slots(SlotPlan.uniform(TRUNK, N_EXPERT, N_EXPERT))      # all slots, between replies
            await shown(pilot, "since the slots changed: 0 tokens")
            assert "(no tokens yet)" in _text(app, "#split") and "(at 6 slots)" not in _text(app, "#split")
            await reply(pilot, "and more about it")
            n = eng.snapshot().window_tokens          # type: ignore[attr-defined]
            await shown(pilot, f"since the slots changed: {n} tokens")
            assert n >= 24 and _host(app) == 0 and _cpu(app) == 0.0
            assert _misses(app) and set(_misses(app)) == {0}
            assert "static 100 %" in _text(app, "#whatif") or not _text(app, "#whatif").startswith("what-if")

            eng.set_slots(0)                                               # none: everything on the host
            await reply(pilot, "something else entirely")
            n = eng.snapshot().window_tokens          # type: ignore[attr-defined]
            await shown(pilot, f"since the slots changed: {n} tokens")
            assert _host(app) == 100 and _cpu(app) <= len(TRUNK) * K and set(_misses(app)) == {100}
    finally:
        eng.close()
