"""Model text as the chat shows it: Markdown, but never lost to the parser.

- Terminal control characters (ESC, BEL, CR...) are replaced: a reply must never drive the terminal.
- Raw HTML is text: with markdown-it's `html` on, `<?` (or `<div>`, `<!--`...) opens an HTML block that runs to
  the end of the reply or the next blank line, and the Markdown widget draws HTML blocks as nothing.
- Python doctest lines (`>>> x`) are a code block, not three nested quotes: a run of lines starting at a `>>>`
  line, outside a code fence, up to the next blank line, is fenced as `pycon`.

`as_markdown` is what a chat message's Markdown widget gets; the streaming path (tui/stream.py) applies
`doctest_fences` to each finished block, which starts outside any fence, so the blocks add up to `as_markdown`
of the whole reply.
"""

from __future__ import annotations

from markdown_it import MarkdownIt

_CONTROL = {c: "\ufffd" for c in range(32) if c not in (9, 10)} | {127: "\ufffd"}
DOCTEST_LANG = "pycon"


def printable(text: str) -> str:
    """Model text with terminal control characters replaced (random-weight models emit raw byte tokens; real ones
    can too)."""
    return text.translate(_CONTROL)


def parser() -> MarkdownIt:
    """The chat's Markdown parser: GitHub-like, raw HTML shown as text."""
    return MarkdownIt("gfm-like", {"html": False})


def _fence_marker(line: str) -> str:
    s = line.lstrip()
    if len(line) - len(s) > 3 or not s.startswith(("```", "~~~")):
        return ""
    return s[0] * (len(s) - len(s.lstrip(s[0])))


def _doctest(line: str) -> bool:
    s = line.lstrip(" ")
    return len(line) - len(s) < 4 and s.startswith(">>>") and (len(s) == 3 or s[3] in " \t")


def doctest_fences(text: str) -> str:
    """Each run of doctest lines outside a code fence, fenced as pycon (see the module docstring)."""
    if ">>>" not in text:
        return text
    out: list[str] = []
    fence = ""                  # the open fence's marker, "" outside fences
    in_run = False
    for line in text.split("\n"):
        if in_run and (not line.strip() or _fence_marker(line)):
            out.append("```")
            in_run = False
        if fence:
            m = _fence_marker(line)
            if m and m[0] == fence[0] and len(m) >= len(fence) and not line.strip().strip(m[0]):
                fence = ""
        elif not in_run:
            m = _fence_marker(line)
            if m:
                fence = m
            elif _doctest(line):
                out.append(f"```{DOCTEST_LANG}")
                in_run = True
        out.append(line)
    if in_run:
        out.append("```")
    return "\n".join(out)


def as_markdown(text: str) -> str:
    return doctest_fences(printable(text))


def code_blocks(text: str) -> list[str]:
    """The code blocks of a message, in order, without their last newline (what Ctrl+B copies the last of; a click
    on a block copies the same text)."""
    tokens = parser().parse(as_markdown(text))
    return [t.content.removesuffix("\n") for t in tokens if t.type in ("fence", "code_block")]
