"""Record the routing donor's traces with moeslots' own recorder, and its MTP acceptance on the same prompts.

    python scripts/train/record_donor.py DONOR.gguf CORPUS_DIR OUT_DIR [--tokens 4000] [--threads N]

Three workloads, from held-out documents of the corpus (never trained on), each recorded twice — greedy and sampled
(temperature 0.7, seeded) — until it has >= --tokens decode tokens:

- code:  raw completion (no chat template) of the first ~48 tokens of held-out Python: stdlib files, cut at several
         places, and the bodies of held-out "Write `f` from the `m` module." answers;
- chat:  the held-out chat questions in the model's chat template (Python "What does `x` do?", "Write `f` ...",
         "Explain ...", and the command and package questions of corpus --more);
- prose: raw completion of the first ~48 tokens of held-out prose (docstrings, man pages, package docs).

Prompt + reply stay within the 256 positions the donor was trained on (a prompt of <= 48 tokens, <= 192 decoded).
Writes OUT/NAME-{code,chat,prose}-{greedy,sampled}.npz (the facts say workload, decode mode, temperature, seed,
prompts and template), OUT/prompts.json and OUT/mtp.json (greedy acceptance with 1-3 drafts per workload). The ids of
each row are kept in ascending order (`ids=sorted`): the router's rank order is not kept — no policy, plan or replay
uses it, and sorted rows compress to 0.6 instead of 1.0 MB per trace.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
from corpus import read_docs

from moeslots.engine.llm import mtp as mtp_mod
from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.llm.template import render_chat
from moeslots.engine.runtime import record as record_mod
from moeslots.profiles.trace import Trace, merge, read_csv, write_csv

Q = re.compile(r"<\|user\|>\n(.*?)\n<\|assistant\|>\n(.*)", re.S)
PROMPT_CHARS = 160           # ~48 tokens of code or prose
N_DECODE = 192
BATCH = 2                    # prompts per recorder call: stops within 2 replies of --tokens


def prompts(corpus: Path) -> dict[str, list[str]]:
    """The prompts of each workload, in a fixed order."""
    ho = corpus / "heldout"
    code, chat, prose = [], [], []
    for d in read_docs(ho / "code.txt"):
        lines = d.splitlines()
        for start in range(0, len(lines), max(1, len(lines) // 4)):     # four cuts per file
            piece = "\n".join(lines[start:start + 12])[:PROMPT_CHARS]
            if len(piece.strip()) > 40:
                code.append(piece)
    for d in read_docs(ho / "chat.txt"):
        m = Q.search(d)
        if not m:
            continue
        chat.append(m.group(1))
        ans = m.group(2)
        if ans.startswith("```python\n"):
            code.append(ans[len("```python\n"):][:PROMPT_CHARS])
    for d in read_docs(ho / "prose.txt"):
        if len(d) > 80:
            prose.append(d[:PROMPT_CHARS])
    return {"code": code, "chat": chat, "prose": prose}


def record_workload(model: Path, items: list[str], out: Path, *, raw: bool, temperature: float, seed: int,
                    tokens: int, threads: int | None) -> tuple[Path, int]:
    """Prompts in batches of BATCH until >= tokens decode tokens; returns (trace file, prompts used)."""
    tmp = out.parent / f".{out.name}.parts"
    tmp.mkdir(exist_ok=True)
    saved = record_mod.render_chat
    if raw:
        record_mod.render_chat = lambda m, messages: "".join(x.content for x in messages)   # raw completion
    parts, done, used = [], 0, 0
    try:
        for b in range(0, len(items), BATCH):
            files = []
            for j, text in enumerate(items[b:b + BATCH]):
                f = tmp / f"{b + j:04d}.txt"
                f.write_text(text)
                files.append(f)
            part = tmp / f"{b:04d}.csv"
            t = record_mod.record(model, files, part, n_decode=N_DECODE, threads=threads, n_ctx=512,
                                  temperature=temperature, seed=seed + b)
            parts.append(part)
            done += t.decode_tokens
            used += len(files)
            if done >= tokens:
                break
    finally:
        record_mod.render_chat = saved
    tr = merge([read_csv(p) for p in parts], [str(p) for p in parts])
    return _finish(tr, parts, tmp, out), used


def _finish(tr: Trace, parts: list[Path], tmp: Path, out: Path) -> Path:
    write_csv(tr, out)
    for p in parts:
        p.unlink()
    for p in tmp.iterdir():
        p.unlink()
    tmp.rmdir()
    return out


def keep(tr: Trace, path: Path, facts: dict[str, str]) -> None:
    """Write the trace as kept: each row's ids sorted, the facts added."""
    write_csv(Trace(tr.pos, tr.layer, np.sort(tr.ids, axis=1), {**tr.meta, **facts, "ids": "sorted"}), path)


def mtp_acceptance(model: Path, items: dict[str, list[str]], raw: dict[str, bool], threads: int | None,
                   n_prompts: int = 12, n_predict: int = 96) -> dict:
    """Greedy generation with the NextN head drafting 1..3 tokens on each workload's first prompts."""
    m = Model(model, LoadOptions(load_mtp=True))
    from moeslots.engine.api import Message

    res: dict = {}
    try:
        ctx = Context(m, n_ctx=512, threads=threads)
        for w, texts in items.items():
            seqs = [m.tokenize(t if raw[w] else render_chat(m, [Message("user", t)]), add_special=False,
                               parse_special=True) for t in texts[:n_prompts]]
            res[w] = {}
            for nd in (1, 2, 3):
                mt = mtp_mod.MTP(m, ctx, n_draft=nd, threads=threads)
                for s in seqs:
                    mtp_mod.greedy_tokens(mt, s, n_predict, m.is_eog)
                st = mt.stats
                res[w][f"draft{nd}"] = {"acceptance": st.acceptance, "tokens_per_step": st.tokens_per_step,
                                        "drafted": st.drafted, "accepted": st.accepted}
                mt.close()
        ctx.close()
    finally:
        m.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("corpus", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--name", default="moeslots-donor-qwen3-30b-a3b")
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--only", default="", help="workloads to record (default all), e.g. code,chat")
    ap.add_argument("--no-mtp", action="store_true")
    ap.add_argument("--mtp-only", action="store_true", help="only the MTP acceptance (the traces exist)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    items = prompts(a.corpus)
    raw = {"code": True, "chat": False, "prose": True}
    (a.out / "prompts.json").write_text(json.dumps(items, indent=1))
    for i, (w, texts) in enumerate(items.items()):
        if (a.only and w not in a.only.split(",")) or a.mtp_only:
            continue
        for mode, temp in (("greedy", 0.0), ("sampled", a.temperature)):
            dst = a.out / f"{a.name}-{w}-{mode}.npz"
            seed = 1000 + 100 * i
            path, used = record_workload(a.model, texts, dst, raw=raw[w], temperature=temp, seed=seed,
                                         tokens=a.tokens, threads=a.threads)
            tr = read_csv(path)
            keep(tr, path, {"workload": w, "decode": mode, "temperature": str(temp), "seed": str(seed),
                            "prompts": str(used), "template": "none" if raw[w] else "chat"})
            tr = read_csv(path)
            print(f"{path}: {tr.decode_tokens} decode tokens, {tr.n_rows} rows, {used} prompts, "
                  f"{path.stat().st_size / 1e6:.2f} MB", flush=True)
    if not a.no_mtp:
        res = mtp_acceptance(a.model, items, raw, a.threads)
        (a.out / "mtp.json").write_text(json.dumps(res, indent=1))
        print(json.dumps(res))


if __name__ == "__main__":
    main()
