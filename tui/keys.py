"""The app's keys: one Binding per action, each with an id that `[keymap]` in config.toml rebinds (docs/reference.md).

App keys are priority bindings, so they work from the prompt box too (the text area binds Ctrl+E, Ctrl+Y, F6, F7
for itself); while a dialog is open the app turns them off (MoeslotsApp.check_action) and the dialog's own keys
and text fields get them. Esc is not a priority binding: a dialog's Esc closes the dialog.
"""

from __future__ import annotations

import dataclasses

from textual.binding import Binding


def _b(key: str, action: str, description: str, id: str, show: bool = False, priority: bool = True) -> Binding:
    return Binding(key, action, description, show=show, priority=priority, id=id)


BINDINGS: list[Binding] = [
    _b("f1", "help", "Keys", "help", show=True),
    _b("escape", "stop", "Stop", "stop", show=True, priority=False),
    # Ctrl+C stops a running reply as Esc does; otherwise (check_action turns it off) the key goes on to Textual's
    # own Ctrl+C: the prompt box copies its selection, else the app says how to quit (MoeslotsApp.BINDINGS)
    _b("ctrl+c", "interrupt", "Stop the reply", "interrupt"),
    _b("ctrl+l", "chats", "Chats", "chats", show=True),
    _b("ctrl+n", "new_chat", "New chat", "new_chat", show=True),
    _b("f5", "regenerate", "Regenerate", "regenerate"),
    _b("f6", "edit_last", "Edit last question", "edit_last"),
    _b("f2", "system_prompt", "System prompt", "system_prompt"),
    _b("f7", "sampling", "Sampling", "sampling"),
    _b("ctrl+y", "copy_last", "Copy answer", "copy_last"),
    _b("ctrl+b", "copy_code", "Copy code block", "copy_code"),
    _b("ctrl+e", "export", "Export chat", "export"),
    _b("ctrl+s", "slots", "Slots", "slots", show=True),
    _b("ctrl+r", "record", "Record profile", "record", show=True),
    _b("f3", "toggle_repick", "Re-pick", "repick"),
    _b("f4", "models", "Models", "models"),
    _b("ctrl+t", "toggle_inspector", "Inspector", "inspector", show=True),
    _b("ctrl+o", "sort_heatmap", "Sort slots", "sort_heatmap"),
    _b("ctrl+q", "quit", "Quit", "quit", show=True),
]
IDS = {b.id for b in BINDINGS}


@dataclasses.dataclass(frozen=True)
class HelpRow:
    keys: str                 # as shown, e.g. "Ctrl+S"
    what: str


# what each key does, for the help screen (F1): (binding id, or "" and the keys as shown, what), grouped
GROUPS: list[tuple[str, list[tuple[str, str, str]]]] = [
    ("Chat", [
        ("", "Enter", "send (while a reply runs or stops: sent once it has ended)"),
        ("", "Shift+Enter / Ctrl+J", "a new line in the prompt box"),
        ("stop", "", "stop the reply (nothing said yet: your question goes back into the prompt box, selected)"),
        ("interrupt", "", "stop the reply, as Esc does (no reply running: copy the selection, or how to quit)"),
        ("regenerate", "", "answer the last question again (with this chat's sampling)"),
        ("edit_last", "", "take the last question (and its answer) back into the prompt box to edit and resend"),
        ("new_chat", "", "a new chat (this one stays in the history)"),
        ("chats", "", "the chat list: open, rename, delete, search old chats"),
        ("system_prompt", "", "this chat's system prompt"),
        ("sampling", "", "this chat's sampling: temperature (0 = greedy), top-p, seed"),
        ("copy_last", "", "copy the last answer"),
        ("copy_code", "", "copy the last code block of the last answer (or click any code block)"),
        ("export", "", "export the chat as Markdown"),
    ]),
    ("Engine", [
        ("slots", "", "change the slots per layer (a number or auto) without losing the chat"),
        ("record", "", "record a routing profile; again: save it"),
        ("repick", "", "adaptive residency on/off (re-pick every 16 tokens)"),
        ("models", "", "the model picker: switch to another GGUF on this machine"),
        ("inspector", "", "show/hide the inspector"),
        ("sort_heatmap", "", "heatmap cells in slot order or sorted by recent hits"),
    ]),
    ("App", [
        ("help", "", "this help (again or Esc: close)"),
        ("", "Ctrl+P", "the command palette: every action by name"),
        ("quit", "", "quit"),
    ]),
]

_NAMES = {"escape": "Esc", "enter": "Enter", "pageup": "PgUp", "pagedown": "PgDn", "delete": "Del"}


def key_display(keys: str) -> str:
    """"ctrl+s,f9" -> "Ctrl+S / F9"."""
    out = []
    for key in keys.split(","):
        parts = key.strip().split("+")
        out.append("+".join(_NAMES.get(p, p.upper() if len(p) == 1 or p[0] == "f" and p[1:].isdigit()
                                       else p.capitalize()) for p in parts))
    return " / ".join(out)


def keys_of(binding_id: str, keymap: dict[str, str]) -> str:
    """The keys bound to an app binding id now (the keymap's, else the default), as shown."""
    for b in BINDINGS:
        if b.id == binding_id:
            return key_display(keymap.get(binding_id, b.key))
    raise KeyError(binding_id)


WHAT: dict[str, str] = {bid: what for _, rows in GROUPS for bid, _, what in rows if bid}   # binding id -> what


def palette_help(binding_id: str, keymap: dict[str, str]) -> str:
    """A command's second line in the command palette (Ctrl+P): what it does and its keys, e.g. "the chat list:
    open, rename, delete, search old chats · Ctrl+L". (It was the command's name again, with the keys: every
    action read as listed twice.)"""
    return f"{WHAT[binding_id]} · {keys_of(binding_id, keymap)}"


def help_rows(keymap: dict[str, str]) -> list[tuple[str, list[HelpRow]]]:
    out = []
    for group, rows in GROUPS:
        shown = []
        for bid, keys, what in rows:
            shown.append(HelpRow(keys_of(bid, keymap) if bid else keys, what))
        out.append((group, shown))
    return out


def keymap_problems(keymap: dict[str, str]) -> list[str]:
    """One line per [keymap] entry that cannot work: an unknown binding id, or a key two app actions share."""
    lines = [f"[keymap] {bid}: no such key binding (known: {', '.join(sorted(i for i in IDS if i))})"
             for bid in keymap if bid not in IDS and not bid.startswith(("prompt.", "chats."))]
    owner: dict[str, str] = {}
    for b in BINDINGS:
        assert b.id is not None
        for key in keymap.get(b.id, b.key).split(","):
            key = key.strip()
            other = owner.setdefault(key, b.id)
            if other != b.id:
                mapped = [i for i in (other, b.id) if i in keymap]
                wins = f"{mapped[0]} wins" if len(mapped) == 1 else "only one of them works"
                lines.append(f"[keymap] {key_display(key)} is bound to both {other} and {b.id}: {wins}")
    return lines
