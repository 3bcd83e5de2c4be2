"""docs/screenshots/app.{svg,png}: the real app and engine on the bundled model (its merged profile, 16 of 64 slots
per layer in host memory: no GPU needed), after two replies. Run from the repo root with the venv:

    python scripts/screenshot.py            # needs rsvg-convert for the PNG
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from moeslots.engine.machine import bundled
from moeslots.engine.runtime.engine import Engine, EngineConfig
from moeslots.tui.app import MoeslotsApp, Prompt
from moeslots.tui.store import Store

QUESTIONS = ["What does `json.dumps` do?", "Write `dedent` from the `textwrap` module."]


async def main() -> None:
    out = Path("docs/screenshots")
    eng = Engine(EngineConfig(model=bundled.model(), profile=bundled.profile("merged"), slots=16, pack_host=True,
                              threads=2, n_ctx=2048, max_tokens=160))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "chats.sqlite")
        app = MoeslotsApp(eng, store=store, model_name=bundled.model().name)
        try:
            async with app.run_test(size=(150, 46)) as pilot:
                for i, q in enumerate(QUESTIONS):
                    app.query_one(Prompt).text = q
                    await pilot.press("enter")
                    t0 = time.monotonic()
                    while len(store.messages(app.chat_id)) < 2 * (i + 1) and time.monotonic() - t0 < 120:
                        await pilot.pause(0.2)
                await pilot.pause(1.5)                           # the inspector's next refresh
                svg = app.save_screenshot(filename="app.svg", path=str(out))
        finally:
            eng.close()
    print(f"wrote {svg}")
    if shutil.which("rsvg-convert"):
        # Textual writes spaces as &#160;; without xml:space="preserve" rsvg drops them at the start of a text run
        # (after every inline code span)
        svg_path = out / "app.svg"
        svg_path.write_text(svg_path.read_text().replace("<svg ", '<svg xml:space="preserve" ', 1))
        subprocess.run(["rsvg-convert", "-o", str(out / "app.png"), str(svg_path)], check=True)
        print(f"wrote {out / 'app.png'}")


if __name__ == "__main__":
    asyncio.run(main())
