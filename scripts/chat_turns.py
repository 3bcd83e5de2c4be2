"""A multi-turn chat in the real app, headless (Textual pilot, 160x48): N turns in one conversation on MODEL with the
real engine, each a follow-up to the last. Prints per turn the prompt tokens read, decode tokens and tok/s, whether
the turn had to re-read its prompt (recurrent models) and MTP acceptance; exits 1 if a turn failed or the stored
history does not hold every turn.

    python scripts/chat_turns.py MODEL.gguf [--turns 5] [--slots 124] [--threads 16] [--no-mtp] [--json F]

Slots: an evenly spread plan (right for a random-weight model, whose routing prefers no expert); --profile P uses
the profile's plan instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

QUESTIONS = ["What does a mixture-of-experts layer do?", "And how many experts does each token use?",
             "Why keep some of them on the GPU?", "What happens to the others?", "Summarise that in one line."]


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from moeslots.engine.native.expert_cache import SlotPlan
    from moeslots.engine.runtime.engine import Done, Engine, EngineConfig
    from moeslots.tui.app import MoeslotsApp, Prompt
    from moeslots.tui.store import Store

    cfg = EngineConfig(model=Path(args.model), n_ctx=args.ctx, threads=args.threads, mtp=not args.no_mtp,
                       max_tokens=args.tokens, profile=Path(args.profile) if args.profile else None,
                       slots=args.slots if args.profile else 0, pack_host=args.pack_host)
    engine = Engine(cfg)
    f = engine.model.facts
    if args.slots and not args.profile:
        engine.set_slots(SlotPlan.uniform([il for il in f.moe_layers if il < f.n_layer], args.slots, f.n_expert))
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "chats.sqlite")
        app = MoeslotsApp(engine, store=store, model_name=Path(args.model).name)
        done: list[Any] = []                                    # each turn's Done, or the exception it raised
        chat = engine.chat

        def recording_chat(*a: Any, **kw: Any) -> Any:
            try:
                for ev in chat(*a, **kw):
                    if isinstance(ev, Done):
                        done.append(ev)
                    yield ev
            except Exception as e:
                done.append(e)
                raise

        engine.chat = recording_chat                            # type: ignore[method-assign]
        try:
            async with app.run_test(size=(160, 48)) as pilot:
                await pilot.pause(0.3)
                for i in range(args.turns):
                    n = len(done)
                    app.query_one(Prompt).text = QUESTIONS[i % len(QUESTIONS)]
                    await pilot.press("enter")
                    t0 = time.monotonic()
                    while len(done) == n or app.busy:
                        if time.monotonic() - t0 > args.timeout:
                            raise TimeoutError(f"turn {i + 1} did not finish in {args.timeout:.0f} s")
                        await pilot.pause(0.05)
                    ev = done[-1]
                    snap = engine.snapshot()
                    err = str(ev) if isinstance(ev, Exception) else None
                    st = None if err else ev.stats
                    rows.append({"turn": i + 1, "error": err, "prompt_tokens": st.prompt_tokens if st else 0,
                                 "tokens": st.tokens if st else 0, "tok_s": snap.tok_s_last,
                                 "reread": bool(st and st.reread),
                                 "mtp_accept": snap.mtp_accepted / snap.mtp_drafted if snap.mtp_drafted else None})
                    if err:
                        errors.append(f"turn {i + 1}: {err}")
                stored = store.messages(app.chat_id)
        finally:
            store.close()
            engine.close()
    if len(stored) != 2 * args.turns:
        errors.append(f"the history holds {len(stored)} messages, expected {2 * args.turns}")
    for r in rows:
        acc = "-" if r["mtp_accept"] is None else f"{100 * r['mtp_accept']:.0f} %"
        print(f"turn {r['turn']}: prompt {r['prompt_tokens']} tokens{' (re-read)' if r['reread'] else ''}, "
              f"{r['tokens']} decoded at {r['tok_s']:.1f} tok/s, MTP accept {acc}"
              + (f", ERROR {r['error']}" if r["error"] else ""))
    for e in errors:
        print(f"FAIL {e}", file=sys.stderr)
    if errors:
        raise SystemExit(1)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--slots", type=int, default=0)
    p.add_argument("--profile", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--tokens", type=int, default=128, help="decode tokens per reply at most")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--no-mtp", action="store_true")
    p.add_argument("--pack-host", action="store_true", help="slots in host memory (no GPU)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = asyncio.run(run(args))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
