"""Run by tests/tui/test_kill.py in a subprocess (it gets SIGKILLed): the real app, headless (Textual pilot), with
the real engine on MODEL and chat history in DB, answering one question after another. After each finished turn it
prints a JSON line with the question and the reply as the screen shows it; with --stall N the reply of turn N stops
after its first piece of text (the generating thread waits) and `STREAMING` is printed: killed there, the app dies
mid-reply.

    python tests/tui/app_turns.py MODEL DB [--turns N] [--stall N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator


def say(obj: Any) -> None:
    sys.stdout.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    sys.stdout.flush()


async def run(a: argparse.Namespace) -> None:
    from moeslots.engine.runtime.engine import Engine, EngineConfig, TextDelta
    from moeslots.tui.app import MoeslotsApp, Prompt
    from moeslots.tui.store import Store
    from moeslots.tui.widgets.chat import ChatMessage

    engine = Engine(EngineConfig(model=Path(a.model), n_ctx=4096, threads=1, pack_host=True, max_tokens=a.tokens))
    chat, turn = engine.chat, [0]

    def stalling_chat(*args: Any, **kw: Any) -> Iterator[Any]:
        for ev in chat(*args, **kw):
            yield ev
            if turn[0] == a.stall and isinstance(ev, TextDelta):
                say("STREAMING")
                threading.Event().wait(3600)                   # mid-reply until killed

    engine.chat = stalling_chat                                 # type: ignore[method-assign]
    store = Store(Path(a.db))
    app = MoeslotsApp(engine, store=store, model_name=Path(a.model).name)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.2)
        for i in range(1, a.turns + 1):
            turn[0] = i
            question = f"Question {i}: what does the {['json', 'os', 're', 'csv'][i % 4]} module do?"
            before = len(app.query_one("#chat-log").query(ChatMessage))
            app.query_one(Prompt).text = question
            await pilot.press("enter")
            t0 = time.monotonic()
            while len(app.query_one("#chat-log").query(ChatMessage)) < before + 2 or app.busy:
                await pilot.pause(0.02)                         # the reply is settled: stored and drawn
                if time.monotonic() - t0 > 120:
                    raise TimeoutError(f"turn {i} did not finish")
            shown = list(app.query_one("#chat-log").query(ChatMessage))
            user, reply = shown[-2], shown[-1]
            say({"turn": i, "user": user.text, "shown": reply.query_one("Markdown").source})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("db")
    p.add_argument("--turns", type=int, default=1000)
    p.add_argument("--stall", type=int, default=0)
    p.add_argument("--tokens", type=int, default=24)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
