"""Model text as the chat shows it: Markdown, but never lost to the parser.

- Terminal control characters (ESC, BEL, CR...) are replaced: a reply must never drive the terminal.
- Raw HTML is text: with markdown-it's `html` on, `<?` (or `<div>`, `<!--`...) opens an HTML block that runs to
  the end of the reply or the next blank line, and the Markdown widget draws HTML blocks as nothing.
- Python doctest lines (`>>> x`) are a code block, not three nested quotes: a run of lines starting at a `>>>`
  line, outside a code fence, up to the next blank line, is fenced as `pycon`.

`as_markdown` is what a chat message's Markdown widget gets; the streaming path (tui/stream.py) applies
`doctest_fences` to each finished block, which starts outside any fence, so the blocks add up to `as_markdown`
of the whole reply.

Also here: the marker a stopped reply carries (in the pane and in the history), and the Markdown export.
"""

from __future__ import annotations

import time

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


def open_fence(text: str) -> str:
    """The marker of the code fence `text` leaves open at its end ("" when none): a reply stopped mid-block."""
    fence = ""
    for line in text.split("\n"):
        m = _fence_marker(line)
        if not fence:
            fence = m
        elif m and m[0] == fence[0] and len(m) >= len(fence) and not line.strip().strip(m[0]):
            fence = ""
    return fence


def as_markdown(text: str) -> str:
    return doctest_fences(printable(text))


def code_blocks(text: str) -> list[str]:
    """The code blocks of a message, in order, without their last newline (what Ctrl+B copies the last of; a click
    on a block copies the same text)."""
    tokens = parser().parse(as_markdown(text))
    return [t.content.removesuffix("\n") for t in tokens if t.type in ("fence", "code_block")]


# -- a stopped reply's marker ---------------------------------------------------------------------------------------

STOPPED = "*— stopped*"            # Markdown: drawn as an italic "— stopped" line under the reply's text
_STOP_TAIL = "\n\n" + STOPPED


def mark_stopped(text: str) -> str:
    """A reply stopped by the user (Esc, Ctrl+C), as the pane shows it and the history keeps it: its text, then the
    marker on a line of its own. A code fence the reply left open is closed first (else the marker is drawn as
    code); `unmarked` gives the model the text without the marker (that closing line stays)."""
    fence = open_fence(text)
    close = ("" if text.endswith("\n") else "\n") + fence if fence else ""
    return text + close + _STOP_TAIL


def unmarked(text: str) -> str:
    """A stored reply without the stopped marker (what the model is given back, what Ctrl+Y copies)."""
    return text.removesuffix(_STOP_TAIL)


# -- the Markdown export ----------------------------------------------------------------------------------------

def export_header(title: str, model: str, sampling: str, system: str, started: float | None,
                  now: float | None = None) -> str:
    """The export's first lines: the chat's title, model, date (started, exported), sampling, system prompt."""
    def day(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))

    exported = day(time.time() if now is None else now)
    date = f"{day(started)} (exported {exported})" if started else exported
    lines = [f"# {title or 'moeslots chat'}", "",
             f"- **model:** {model or 'unknown'}",
             f"- **date:** {date}",
             f"- **sampling:** {sampling}"]
    if system.strip():
        lines += ["- **system prompt:**", "", *(f"  > {line}".rstrip() for line in system.strip().split("\n"))]
    return "\n".join(lines) + "\n"


def export_markdown(header: str, messages: list[tuple[str, str]]) -> str:
    """The whole export: the header, a rule, then each message under its role."""
    body = [f"## {role}\n\n{content}\n" for role, content in messages]
    return "\n".join([header, "---\n", *body])
