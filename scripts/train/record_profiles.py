"""Record the bundled model's routing profiles with moeslots' own recorder: a code trace and a chat trace from
held-out questions of the corpus (never trained on), each >= 2,000 decode tokens, and their merge.

    python scripts/train/record_profiles.py MODEL.gguf CORPUS_DIR OUT_DIR [--name NAME]

Code prompts are the held-out "Write `f` from the `m` module." turns; chat prompts are the held-out "What does
... do?" / "Explain ..." turns. Answers are sampled at temperature 0.7 (seeded), up to 400 tokens each, until the
domain has --tokens decode tokens. Writes NAME-code.csv, NAME-chat.csv, NAME-merged.csv and the prompts used.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from corpus import read_docs

from moeslots.engine.runtime.record import record
from moeslots.profiles.trace import merge, read_csv, write_csv

Q = re.compile(r"<\|user\|>\n(.*?)\n<\|assistant\|>", re.S)


def questions(corpus: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"code": [], "chat": []}
    for d in read_docs(corpus / "heldout" / "chat.txt"):
        m = Q.search(d)
        if m:
            out["code" if m.group(1).startswith("Write ") else "chat"].append(m.group(1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("corpus", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--name", default="moeslots-tiny-glm4moe")
    ap.add_argument("--tokens", type=int, default=2500)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    qs = questions(a.corpus)
    paths = []
    for i, (dom, items) in enumerate(qs.items()):
        pdir = a.out / f"prompts-{dom}"
        pdir.mkdir(exist_ok=True)
        files = []
        for j, q in enumerate(items):
            f = pdir / f"{j:03d}.txt"
            f.write_text(q)
            files.append(f)
        dst = a.out / f"{a.name}-{dom}.csv"
        # the recorder stops a turn at end-of-generation: take prompts in batches until enough decode tokens
        done, parts = 0, []
        for b in range(0, len(files), 8):
            part = a.out / f".{dom}-{b}.csv"
            t = record(a.model, files[b:b + 8], part, n_decode=400, threads=a.threads, temperature=0.7,
                       seed=100 * i + b)
            parts.append(part)
            done += t.decode_tokens
            if done >= a.tokens:
                break
        tr = merge([read_csv(p) for p in parts], [str(p) for p in parts])
        tr.meta["workload"] = dom
        write_csv(tr, dst)
        for p in parts:
            p.unlink()
        print(f"{dst}: {tr.decode_tokens} decode tokens, {tr.n_rows} rows, {len(files[:b + 8])} prompts")
        paths.append(dst)
    m = merge([read_csv(p) for p in paths], [str(p) for p in paths])
    m.meta["workload"] = "code+chat"
    write_csv(m, a.out / f"{a.name}-merged.csv")
    print(f"{a.out / f'{a.name}-merged.csv'}: {m.decode_tokens} decode tokens")


if __name__ == "__main__":
    main()
