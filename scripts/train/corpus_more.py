"""More prose and chat for the routing donor (`corpus.py --more`): text that is on any Debian-like machine, outside
Python, so the router sees domains other than the standard library.

- prose: manual pages (`/usr/share/man/man{1,5,8}`, English only), turned from roff into plain text by dropping
         requests and font escapes (crude, no groff needed: fast and the same on every machine), at most 12 KiB
         each; and package documentation in `/usr/share/doc` (README*, *.md, *.txt, *.rst, plain or gzipped,
         1-64 KiB).
- chat:  "What does the `cmd` command do?" -> the page's NAME line and its first DESCRIPTION paragraphs;
         "How do I use `cmd`?" -> its SYNOPSIS and the first options; "What is `pkg`?" -> the first paragraphs of
         the package's README.

Sorted file lists and caps keep the corpus the same for the same machine.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Iterator

MAN_DIRS = [Path("/usr/share/man") / d for d in ("man1", "man5", "man8")]
DOC_DIR = Path("/usr/share/doc")
DOC_NAMES = re.compile(r"^(README.*|.*\.(md|txt|rst|markdown))(\.gz)?$", re.I)
_ESC = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\s[+-]?\d|\\[&|^%]|\\\*(\(..|\[[^\]]*\]|.)|\\\"")
_GLYPH = {r"\-": "-", r"\(em": "--", r"\(en": "-", r"\(lq": '"', r"\(rq": '"', r"\(aq": "'", r"\(bu": "*",
          r"\e": "\\", r"\ ": " ", r"\(co": "(c)", r"\(oq": "'", r"\(cq": "'", r"\~": " ", r"\(dq": '"'}


def _read(p: Path, limit: int) -> str:
    try:
        raw = gzip.open(p).read(limit * 4) if p.suffix == ".gz" else p.read_bytes()[:limit * 4]
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return ""


def roff_text(src: str) -> tuple[str, dict[str, str]]:
    """(plain text, {section name: its text}) of a man page's roff source."""
    out: list[str] = []
    sections: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in src.splitlines():
        if line.startswith((".\\\"", "'\\\"", "\\\"")):
            continue
        if line.startswith((".", "'")):
            req, _, arg = line[1:].partition(" ")
            req = req.strip()
            if req in ("SH", "SS"):
                name = _clean(arg.strip().strip('"'))
                out.append("\n" + name)
                cur = sections.setdefault(name.upper(), []) if req == "SH" else cur
                if req == "SS" and cur is not None:
                    cur.append(name)
            elif req in ("PP", "P", "LP", "sp", "br", "TP", "IP") and out and out[-1] != "":
                out.append("")
                if cur is not None:
                    cur.append("")
                if req == "IP" and arg:
                    t = _clean(arg.split('"')[1] if '"' in arg else arg.split()[0])
                    out.append(t)
                    if cur is not None:
                        cur.append(t)
            elif req in ("B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "SM", "SB") and arg:
                t = _clean(arg.replace('"', ""))
                t = t if req in ("B", "I", "SM", "SB") else "".join(t.split())
                out.append(t)
                if cur is not None:
                    cur.append(t)
            continue
        t = _clean(line)
        out.append(t)
        if cur is not None:
            cur.append(t)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()
    return text, {k: re.sub(r"\n{3,}", "\n\n", "\n".join(v)).strip() for k, v in sections.items()}


def _clean(s: str) -> str:
    for a, b in _GLYPH.items():
        s = s.replace(a, b)
    return _ESC.sub("", s).replace("\\", "")


def man_pages(limit: int = 12 * 1024) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(command, text, sections) per English manual page; a page that is only a `.so` redirect is skipped."""
    for d in MAN_DIRS:
        if not d.is_dir():
            continue
        for p in sorted(d.iterdir()):
            src = _read(p, limit)
            if not src or src.lstrip().startswith(".so "):
                continue
            text, sec = roff_text(src)
            if len(text) < 300:
                continue
            cmd = p.name.split(".")[0]
            yield cmd, text[:limit], sec


def doc_texts(limit: int = 64 * 1024) -> Iterator[tuple[str, str, str]]:
    """(key, package, text) per documentation file of 1-64 KiB under /usr/share/doc."""
    if not DOC_DIR.is_dir():
        return
    for p in sorted(DOC_DIR.rglob("*")):
        if not p.is_file() or p.is_symlink() or not DOC_NAMES.match(p.name):
            continue
        t = _read(p, limit)
        if 1024 <= len(t) <= limit and "\x00" not in t:
            yield str(p), p.relative_to(DOC_DIR).parts[0], t


def paragraphs(text: str, n: int, max_chars: int = 1500) -> str:
    ps = [p.strip() for p in re.split(r"\n\s*\n", text) if len(p.strip()) > 40]
    return "\n\n".join(ps[:n])[:max_chars].strip()


def man_turns(cmd: str, sec: dict[str, str]) -> list[tuple[str, str]]:
    """Chat (question, answer) pairs from one man page's sections."""
    out = []
    name = sec.get("NAME", "").strip()
    desc = paragraphs(sec.get("DESCRIPTION", ""), 2)
    if name and desc:
        out.append((f"What does the `{cmd}` command do?", f"{name}\n\n{desc}"))
    syn = sec.get("SYNOPSIS", "").strip()
    opts = paragraphs(sec.get("OPTIONS", ""), 6, 1200)
    if syn and opts:
        out.append((f"How do I use `{cmd}`?", f"```\n{syn[:400]}\n```\n\n{opts}"))
    return out
