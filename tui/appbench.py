"""`moeslots bench app`: the real app, driven headless by Textual's pilot, beside the same engine alone.

Both sides run the same Engine (one load: same model, slots, threads, MTP setting) on the same prompt in a fresh
chat, greedy, so both produce the same text; decode tok/s is what the engine reports for each reply
(`Snapshot.tok_s_last`, decode tokens over decode seconds). The engine-alone side consumes `Engine.chat` in a
worker thread exactly as the app's worker does, minus the app. The ratio app / engine is what a user loses to the
UI; `docs/performance.md` has the figures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

PROMPT = "Write a Python function that reads a CSV file and returns the rows as dictionaries."
SIZE = (160, 48)


@dataclasses.dataclass(frozen=True)
class SideResult:
    name: str                       # "engine" or "app"
    tok_s: tuple[float, ...]        # decode tok/s of each reply, as the engine reports them
    tokens: tuple[int, ...]         # decode tokens of each reply
    mtp_accept: float               # MTP acceptance over this side's replies (0 without MTP)
    text: str                       # the last reply
    ui_busy: float = 0.0            # app: the UI thread's CPU time over the time the engine was generating
    others: float = 0.0             # CPU other processes used meanwhile, in cores (a busy machine skews both)

    @property
    def median(self) -> float:
        return statistics.median(self.tok_s) if self.tok_s else 0.0


@dataclasses.dataclass(frozen=True)
class AppBenchResult:
    model: str
    slots: int
    threads: int
    mtp: bool
    n_tokens: int
    engine: SideResult
    app: SideResult
    same_text: bool                 # the app's reply is the engine alone's, character for character
    mtp_line: str = ""              # the engine's MTP state after both sides (Snapshot.mtp_line)
    cpus: int = 0                   # CPUs this process may run on

    @property
    def ratio(self) -> float:
        return self.app.median / self.engine.median if self.engine.median > 0 else 0.0

    def render(self) -> str:
        acc = (f"; MTP accept {100 * self.engine.mtp_accept:.0f} % / {100 * self.app.mtp_accept:.0f} %, "
               f"now: {self.mtp_line}" if self.mtp else "")
        return "\n".join([
            f"{self.model}: {self.slots} slots/layer, {self.threads} threads of {self.cpus} CPUs, "
            f"MTP {'on' if self.mtp else 'off'}, replies of up to {self.n_tokens} tokens{acc}",
            "| side | decode tok/s (median) | per reply | tokens |",
            "|---|---|---|---|",
            *(f"| {s.name} | {s.median:.1f} | {' '.join(f'{v:.0f}' for v in s.tok_s)} | "
              f"{' '.join(str(n) for n in s.tokens)} |" for s in (self.engine, self.app)),
            f"app / engine: {100 * self.ratio:.0f} %   same text: {'yes' if self.same_text else 'NO'}   "
            f"UI thread busy {100 * self.app.ui_busy:.0f} % of the time the engine generated   "
            f"other processes: {self.engine.others:.2f} / {self.app.others:.2f} cores",
        ])


class OtherLoad:
    """CPU time other processes take from now on (Linux /proc/stat minus this process), in cores."""

    def __init__(self) -> None:
        self._t0, self._busy0, self._own0 = time.perf_counter(), self._machine_busy(), self._own()

    @staticmethod
    def _machine_busy() -> float:
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return 0.0
        return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")      # all but idle and iowait, in seconds

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system

    def cores(self) -> float:
        wall = time.perf_counter() - self._t0
        other = (self._machine_busy() - self._busy0) - (self._own() - self._own0)
        return max(0.0, other / wall) if wall > 0 else 0.0


def _mtp_counts(engine: Any) -> tuple[int, int]:
    snap = engine.snapshot()
    return int(snap.mtp_drafted), int(snap.mtp_accepted)


def _accept(before: tuple[int, int], after: tuple[int, int]) -> float:
    drafted = after[0] - before[0]
    return (after[1] - before[1]) / drafted if drafted else 0.0


def _fresh_mtp(engine: Any) -> None:
    """Both sides start adaptive MTP from the same state (drafting on, nothing measured)."""
    auto = getattr(engine, "mtp_auto", None)
    if auto is not None:
        auto.reset()


def run_engine_side(engine: Any, prompt: str, replies: int) -> SideResult:
    """`replies` replies to `prompt`, each in a new chat, consumed in a worker thread like the app's."""
    from ..engine.runtime.engine import Done, Message

    _fresh_mtp(engine)
    tok_s: list[float] = []
    tokens: list[int] = []
    text = ""
    m0 = _mtp_counts(engine)
    for _ in range(replies):
        engine.new_chat()
        box: dict[str, Any] = {}

        def consume() -> None:
            try:
                for ev in engine.chat([Message("user", prompt)]):
                    if isinstance(ev, Done):
                        box["done"] = ev
            except Exception as e:  # noqa: BLE001 - reported below
                box["error"] = e

        t = threading.Thread(target=consume, name="bench-engine")
        t.start()
        t.join()
        if "error" in box:
            raise box["error"]
        done = box["done"]
        tok_s.append(engine.snapshot().tok_s_last)
        tokens.append(done.stats.tokens)
        text = done.text
    return SideResult("engine", tuple(tok_s), tuple(tokens), _accept(m0, _mtp_counts(engine)), text)


async def _run_app_side(engine: Any, prompt: str, replies: int, store_dir: Path, timeout: float) -> SideResult:
    from textual import events

    from .app import MoeslotsApp, Prompt
    from .store import Store

    _fresh_mtp(engine)
    store = Store(store_dir / "bench-chats.sqlite")
    app = MoeslotsApp(engine, store=store, model_name="bench")
    tok_s: list[float] = []
    tokens: list[int] = []
    text = ""
    busy = wall = 0.0
    m0 = _mtp_counts(engine)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.3)
            for i in range(replies):
                if i:
                    await app.action_new_chat()
                    await _until(pilot, lambda: all(w.is_finished for w in app.workers if w.group == "engine"),
                                 timeout)
                chat = app.chat_id
                app.query_one(Prompt).text = prompt
                marks: list[tuple[float, float]] = []                # (UI thread CPU, wall) at start and end

                def mark() -> bool:                                   # polled every 20 ms by _until
                    if len(marks) == int(not engine.state.generating):              # the Engine's own flag
                        marks.append((time.thread_time(), time.perf_counter()))       # this thread runs the UI
                    return app.last_turn is not None and not app.busy

                # Enter as the terminal would send it; pilot.press() would then wait for the screen, forcing refreshes
                # (and, with short replies, return only once the reply is done)
                app.query_one(Prompt).post_message(events.Key("enter", "\r"))
                await _until(pilot, mark, timeout)
                if len(marks) == 2:
                    busy, wall = busy + marks[1][0] - marks[0][0], wall + marks[1][1] - marks[0][1]
                stats = app.last_turn
                app.last_turn = None
                if stats is None:
                    raise RuntimeError("the app finished a reply without its stats")
                tok_s.append(engine.snapshot().tok_s_last)
                tokens.append(int(stats.tokens))
                msgs = store.messages(chat)
                text = msgs[-1][1] if msgs and msgs[-1][0] == "assistant" else ""
    finally:
        store.close()
    return SideResult("app", tuple(tok_s), tuple(tokens), _accept(m0, _mtp_counts(engine)), text,
                      busy / wall if wall > 0 else 0.0)


async def _until(pilot: Any, cond: Callable[[], bool], timeout: float) -> None:
    """Poll with plain sleeps: pilot.pause() would also visit every widget and force a screen refresh each time,
    work the app does not do on its own."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"the app did not finish within {timeout:.0f} s")
        await asyncio.sleep(0.02)


def run_app_side(engine: Any, prompt: str, replies: int, timeout: float = 600.0) -> SideResult:
    with tempfile.TemporaryDirectory(prefix="moeslots-bench-app-") as d:
        return asyncio.run(_run_app_side(engine, prompt, replies, Path(d), timeout))


def run(engine: Any, *, model: str, slots: int, threads: int, mtp: bool, n_tokens: int, replies: int = 3,
        prompt: str = PROMPT, warmup: bool = True, order: Sequence[str] = ("engine", "app"),
        log: Callable[[str], None] = lambda m: None) -> AppBenchResult:
    """Both sides on one engine (its cfg.max_tokens caps each reply); a warm-up reply first (graphs, page cache)."""
    if warmup:
        log("warm-up reply (engine alone, not counted)")
        run_engine_side(engine, prompt, 1)
    sides: dict[str, SideResult] = {}
    for name in order:
        log(f"{name}: {replies} replies of up to {n_tokens} tokens")
        load = OtherLoad()
        side = (run_engine_side(engine, prompt, replies) if name == "engine" else run_app_side(engine, prompt, replies))
        sides[name] = dataclasses.replace(side, others=load.cores())
    from ..engine.machine.threads import allowed_cpus

    return AppBenchResult(model, slots, threads, mtp, n_tokens, sides["engine"], sides["app"],
                          sides["engine"].text == sides["app"].text, getattr(engine.snapshot(), "mtp_line", ""),
                          len(allowed_cpus()))
