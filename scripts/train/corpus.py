"""Build the training corpus from text that is on the machine (no downloads).

Three domains, each written as NUL-separated documents to <out>/{train,heldout}/<domain>.txt:

- code:  every `*.py` file of this Python's standard library (sysconfig "stdlib" path), without test packages
         (`test`, `tests`, `idle_test`, `*_test*` dirs), `site-packages`, and files over 256 KiB (generated tables).
- prose: the help topics of `pydoc_data/topics.py`; every module, class and function docstring of those stdlib
         files (>= 80 characters, found with `ast`, nothing is imported); the description and licence texts of
         installed packages (`*.dist-info/METADATA` bodies, `LICENSE*`/`COPYING*`/`README*` files in
         site-packages, <= 64 KiB each).
- chat:  the same material as question/answer turns in the model's chat format
         ("<|user|>\\n{question}\\n<|assistant|>\\n{answer}", end of turn = <|endoftext|>, added at tokenization):
         "What does `mod.func` do?" -> its docstring; "What is the `mod` module for?" -> the module docstring;
         "Explain <topic>." -> the help topic; "Write `func` from `mod`." -> its source in a ```python fence
         (functions of <= 1,200 characters); a third of the turns start with a short system message.

With --more (the routing donor's corpus): manual pages and /usr/share/doc texts as more prose, and
command questions as more chat (corpus_more.py); one man page in MORE_EVERY (by hash) is taken.

One document in 50 (by a hash of its source path or key, so the split is stable) goes to heldout/.
A manifest.json records counts and bytes per domain and source.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import site
import sys
import sysconfig
from pathlib import Path

SEP = "\x00"
SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
SYSTEMS = ["You are a helpful assistant.", "You are a concise Python expert.",
           "Answer the question about Python."]


MORE_EVERY = 5


def heldout(key: str) -> bool:
    return int(hashlib.md5(key.encode()).hexdigest(), 16) % 50 == 0


def _taken(key: str) -> bool:
    return int(hashlib.md5(("more:" + key).encode()).hexdigest(), 16) % MORE_EVERY == 0


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if any(d in SKIP_DIRS or d.endswith("_test") or d.startswith("test_") for d in rel[:-1]):
            continue
        if p.stat().st_size > 256 * 1024:
            continue
        out.append(p)
    return out


def clean(s: str) -> str:
    return s.replace(SEP, "").strip()


def docstrings(path: Path, src: str, mod: str) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """([(qualname, docstring)], [(qualname, docstring, source)]) of one file; module docstring under mod."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return [], []
    docs: list[tuple[str, str]] = []
    funcs: list[tuple[str, str, str]] = []
    d = ast.get_docstring(tree)
    if d:
        docs.append((mod, d))

    lines = src.splitlines()

    def walk(node: ast.AST, prefix: str) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = f"{prefix}.{ch.name}"
                ds = ast.get_docstring(ch)
                if ds:
                    docs.append((q, ds))
                    if not isinstance(ch, ast.ClassDef):
                        seg = "\n".join(lines[ch.lineno - 1:ch.end_lineno or ch.lineno])
                        if seg and len(seg) <= 1200:
                            funcs.append((q, ds, seg))
                if isinstance(ch, ast.ClassDef):
                    walk(ch, q)
    walk(tree, mod)
    return docs, funcs


def package_texts() -> list[tuple[str, str]]:
    seen: set[str] = set()
    out = []
    dirs = [Path(p) for p in site.getsitepackages() + [site.getusersitepackages()] if Path(p).is_dir()]
    for d in dirs:
        for p in sorted(d.glob("*.dist-info/*")) + sorted(d.glob("*/LICENSE*")) + sorted(d.glob("*/README*")):
            name = p.name.upper()
            if not (name == "METADATA" or name.startswith(("LICENSE", "COPYING", "README"))) or not p.is_file():
                continue
            if p.stat().st_size > 64 * 1024:
                continue
            try:
                t = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if name == "METADATA":             # the body after the header block
                t = t.split("\n\n", 1)[1] if "\n\n" in t else ""
            t = clean(t)
            h = hashlib.md5(t.encode()).hexdigest()
            if len(t) < 200 or h in seen:
                continue
            seen.add(h)
            out.append((str(p), t))
    return out


def topics() -> list[tuple[str, str]]:
    try:
        from pydoc_data.topics import topics as t
    except ImportError:
        return []
    return [(k, clean(v)) for k, v in sorted(t.items()) if len(v) > 80]


def turn(rng: random.Random, q: str, a: str) -> str:
    sys_msg = f"<|system|>\n{rng.choice(SYSTEMS)}\n" if rng.random() < 1 / 3 else ""
    return f"{sys_msg}<|user|>\n{q}\n<|assistant|>\n{a}"


def build(out: Path, seed: int = 0, more: bool = False) -> dict:
    rng = random.Random(seed)
    buckets: dict[tuple[str, bool], list[str]] = {(d, h): [] for d in ("code", "prose", "chat") for h in (False, True)}
    stats: dict[str, dict[str, int]] = {}

    def add(domain: str, source: str, key: str, text: str) -> None:
        text = clean(text)
        if not text:
            return
        buckets[(domain, heldout(key))].append(text)
        s = stats.setdefault(f"{domain}/{source}", {"docs": 0, "bytes": 0})
        s["docs"] += 1
        s["bytes"] += len(text.encode())

    root = Path(sysconfig.get_paths()["stdlib"])
    for p in stdlib_files():
        try:
            src = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        rel = p.relative_to(root)
        mod = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        add("code", "stdlib .py", str(rel), src)
        docs, funcs = docstrings(p, src, mod)
        for q, d in docs:
            if len(d) >= 80:
                add("prose", "stdlib docstrings", f"{rel}:{q}", d)
                ask = (f"What is the `{q}` module for?" if q == mod else f"What does `{q}` do?")
                add("chat", "docstring answers", f"{rel}:{q}", turn(rng, ask, d))
        for q, d, seg in funcs:
            name = q.rsplit(".", 1)[1]
            add("chat", "function sources", f"{rel}:{q}:src",
                turn(rng, f"Write `{name}` from the `{mod}` module.", f"```python\n{seg}\n```"))
    for k, t in topics():
        add("prose", "pydoc topics", f"topic:{k}", t)
        add("chat", "topic answers", f"topic:{k}", turn(rng, f"Explain {k.replace('-', ' ')} in Python.", t[:2000]))
    for k, t in package_texts():
        add("prose", "package texts", k, t)
    if more:
        import corpus_more

        for cmd, text, sec in corpus_more.man_pages():
            if not _taken(cmd):
                continue
            add("prose", "man pages", f"man:{cmd}", text)
            for q, ans in corpus_more.man_turns(cmd, sec):
                add("chat", "command answers", f"man:{cmd}:{q[:8]}", turn(rng, q, ans))
        for key, pkg, text in corpus_more.doc_texts():
            add("prose", "package docs", key, text)
            if key.rsplit("/", 1)[-1].upper().startswith("README"):
                ans = corpus_more.paragraphs(text, 3)
                if ans:
                    add("chat", "package answers", key + ":q", turn(rng, f"What is `{pkg}`?", ans))
    for (domain, ho), docs in buckets.items():
        d = out / ("heldout" if ho else "train")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{domain}.txt").write_text(SEP.join(docs), encoding="utf-8")
    manifest = {"python": sys.version.split()[0], "stdlib": str(root), "sources": stats,
                "docs": {f"{'heldout' if h else 'train'}/{d}": len(v) for (d, h), v in buckets.items()},
                "bytes": {f"{'heldout' if h else 'train'}/{d}": sum(len(x.encode()) for x in v)
                          for (d, h), v in buckets.items()}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def read_docs(path: Path) -> list[str]:
    t = path.read_text(encoding="utf-8")
    return [d for d in t.split(SEP) if d]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--more", action="store_true", help="add man pages and package docs (the routing donor)")
    a = ap.parse_args()
    m = build(a.out, more=a.more)
    for k, v in sorted(m["bytes"].items()):
        print(f"{k:16} {m['docs'][k]:7} docs {v / 1e6:8.2f} MB")


if __name__ == "__main__":
    main()
