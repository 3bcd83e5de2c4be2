"""A user's own model on first run, headless: what `moeslots chat MODEL` does with no profile and no flags, against
the next session, which starts with the profile the first one saved.

    python scripts/firstrun.py MODEL.gguf [-n 256] [--prompt-file F] [--json OUT.json]

Three sessions on the same model, each the app's engine with the app's defaults (slots "auto" on a GPU, MTP when
the model has a NextN block, the load mode from the free RAM), in a fresh data folder so that no profile exists
at the start:
  1. no profile: the slots are planned from the first prompt's routing, the session's routing saved as the
     model's profile;
  2. the same chat again: it should start with that saved profile (said, and checked);
  0. reference: no slots at all (what the cache buys).
Each session decodes at least N tokens of the model's own greedy text (temperature 0) for one user prompt; when
the model ends its reply earlier, "Continue." turns follow until N tokens are decoded. Decode tok/s is over those
turns (prompt time apart). Routing: the model's own on its own text by default — on a random-weight model that
text repeats itself, and so does its routing (fake locality that flatters any cache); `--replay uniform|TRACE`
routes every session through recorded (or uniform random) expert ids instead, each session through its own rows,
so the saved profile is scored out of sample.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

PROMPT = ("Explain how a least-recently-used cache works, then write a small Python class that implements one "
          "with get and put in constant time, with a short example of its use.")


@dataclasses.dataclass
class Session:
    name: str
    slots: int
    tokens: int
    decode_s: float
    prompt_s: float            # the first turn's prompt time (session 1: includes planning the slots)
    hit_rate: float
    profile: str               # the profile the session started with ("" when none)
    notices: list[str]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.decode_s if self.decode_s > 0 else 0.0


def run_session(name: str, model: Path, n: int, prompt: str, *, auto: bool, slots: int | str, pack_host: bool,
                mtp: bool, threads: int | None, replay_rows: "object | None" = None) -> Session:
    from moeslots.engine.runtime.engine import Done, Engine, EngineConfig, Message

    eng = Engine(EngineConfig(model=model, n_ctx=max(4096, 2 * n + 1024), slots=slots, mtp=mtp, threads=threads,
                              pack_host=pack_host, auto_profile=auto, max_tokens=n))
    try:
        if replay_rows is not None:
            from moeslots.engine.native import replay

            replay.set_replay(eng.ctx.ptr, replay_rows)   # type: ignore[arg-type]
        started_with = str(eng.cfg.profile or "")
        msgs = [Message("user", prompt)]
        tokens, decode_s, prompt_s, hits = 0, 0.0, None, []
        for _ in range(8):
            done = [ev for ev in eng.chat(msgs, max_tokens=n - tokens) if isinstance(ev, Done)][-1]
            tokens += done.stats.tokens
            decode_s += done.stats.seconds
            prompt_s = done.stats.prompt_seconds if prompt_s is None else prompt_s
            hits.append((done.stats.hit_rate, done.stats.tokens))
            if tokens >= n:
                break
            msgs += [Message("assistant", done.text), Message("user", "Continue.")]
        snap = eng.snapshot()
        s = snap.layers[0].slot_experts if snap.layers else ()
        hit = sum(h * t for h, t in hits) / max(1, sum(t for _, t in hits))
        return Session(name, len(s), tokens, decode_s, prompt_s or 0.0, hit, started_with, list(eng.notices))
    finally:
        eng.close()                               # waits for the profile save


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("-n", "--n-tokens", type=int, default=256, help="decode tokens per session (default 256)")
    ap.add_argument("--prompt-file", help="the user prompt (default: a built-in programming question)")
    ap.add_argument("--data-dir", help="where profiles are saved (default: a fresh temporary folder)")
    ap.add_argument("--slots", default=None, help="slots per layer (default: auto on a GPU; 16 with --pack-host)")
    ap.add_argument("--pack-host", action="store_true", help="slots in host memory (a machine without a GPU)")
    ap.add_argument("--no-mtp", action="store_true")
    ap.add_argument("--no-reference", action="store_true", help="skip the no-slots reference session")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--replay", metavar="uniform|TRACE", help="route through uniform random or recorded expert ids "
                    "(each session its own rows) instead of the model's router")
    ap.add_argument("--json", help="also write the sessions as JSON")
    a = ap.parse_args(argv)
    model = Path(a.model)
    prompt = Path(a.prompt_file).read_text(encoding="utf-8") if a.prompt_file else PROMPT
    data = Path(a.data_dir) if a.data_dir else Path(tempfile.mkdtemp(prefix="moeslots-firstrun-"))
    os.environ["XDG_DATA_HOME"] = str(data)              # a fresh data folder: no profile for this model yet

    from moeslots.engine.errors import EngineError
    from moeslots.engine.native import lib as native
    from moeslots.engine.runtime import autoprofile

    native.require_patched()
    pack_host = a.pack_host or not native.gpus()
    slots: int | str = a.slots if a.slots == "auto" else int(a.slots) if a.slots else (16 if pack_host else "auto")
    saved = autoprofile.saved_path(model)
    if saved.exists():
        print(f"firstrun: {saved} exists already: give a fresh --data-dir", file=sys.stderr)
        return 2
    where = "slots in host memory (no speed-up expected)" if pack_host else "slots in VRAM"
    try:
        tables = _replay_tables(a.replay, model, 3) if a.replay else [None] * 3
    except (ValueError, EngineError) as e:
        print(f"firstrun: {e}", file=sys.stderr)
        return 2
    routing = f"replayed {tables[0].source}, its own rows per session" if a.replay else "the model's own greedy text"
    print(f"model {model.name}; {where}; routing: {routing}; {a.n_tokens} decode tokens per session")
    kw = dict(pack_host=pack_host, mtp=not a.no_mtp, threads=a.threads)
    try:
        first = run_session("1 no profile (planned from the first prompt)", model, a.n_tokens, prompt, auto=True,
                            slots=slots, replay_rows=tables[0], **kw)
        second = run_session("2 next session (saved profile)", model, a.n_tokens, prompt, auto=True, slots=slots,
                             replay_rows=tables[1], **kw)
        ref = None if a.no_reference else run_session("0 reference: no slots", model, a.n_tokens, prompt,
                                                      auto=False, slots=0, replay_rows=tables[2], **kw)
    except EngineError as e:
        print(f"firstrun: {e}", file=sys.stderr)
        return 2
    rows = [first, second] + ([ref] if ref else [])
    for line in first.notices:
        print(f"  session 1: {line}")
    for line in second.notices:
        print(f"  session 2: {line}")
    print("| session | slots/layer | decode tokens | decode tok/s | hit % | first prompt s |")
    print("|---|---|---|---|---|---|")
    for s in rows:
        print(f"| {s.name} | {s.slots} | {s.tokens} | {s.tok_s:.1f} | {100 * s.hit_rate:.0f} | {s.prompt_s:.2f} |")
    picked = second.profile == str(saved)
    print(f"second session started with the saved profile: {'yes' if picked else 'NO'} ({saved})")
    if second.tok_s:
        print(f"first session / second session decode speed: {first.tok_s / second.tok_s:.2f} (expected >= 0.90)")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": str(model), "n_tokens": a.n_tokens, "pack_host": pack_host,
                                            "picked_up": picked, "profile": str(saved),
                                            "sessions": [dict(dataclasses.asdict(s), tok_s=s.tok_s) for s in rows]},
                                           indent=1))
    return 0 if picked else 1


def _replay_tables(what: str, model: Path, parts: int) -> list:
    """`parts` disjoint row ranges of one replay table (uniform random, or a trace's decode rows)."""
    from moeslots.engine.llm.facts import inspect_gguf
    from moeslots.engine.native import replay

    f = inspect_gguf(model)
    trunk = [il for il in f.moe_layers if il < f.n_layer]
    full = (replay.uniform(parts * 2048, len(trunk), f.n_expert, f.n_expert_used, seed=3) if what == "uniform"
            else replay.from_trace(Path(what), f.n_expert, f.n_expert_used))
    r = full.n_rows // parts
    if r < 512:
        raise ValueError(f"{what}: {full.n_rows} rows, too few for {parts} sessions of 512")
    return [replay.ReplayTable(full.ids[i * r:(i + 1) * r], f"{full.source}, rows {i * r}-{(i + 1) * r - 1}")
            for i in range(parts)]


if __name__ == "__main__":
    sys.exit(main())
