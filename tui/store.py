"""Chat history in SQLite under $XDG_DATA_HOME/moeslots/ (schema version in PRAGMA user_version)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from .. import configfile

SCHEMA = 1


def data_dir() -> Path:
    return configfile.data_dir()


class Store:
    def __init__(self, path: Path | None = None):
        self.path = path or data_dir() / "chats.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, check_same_thread=False)
        v = self.db.execute("PRAGMA user_version").fetchone()[0]
        if v == 0:
            self.db.executescript("""
                CREATE TABLE IF NOT EXISTS chats (id INTEGER PRIMARY KEY, title TEXT, system TEXT, created REAL);
                CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, chat INTEGER REFERENCES chats(id),
                    role TEXT, content TEXT, created REAL);
                PRAGMA user_version = 1;
            """)
        elif v > SCHEMA:
            raise RuntimeError(f"{self.path} was written by a newer moeslots (schema {v})")

    def new_chat(self, system: str = "") -> int:
        cur = self.db.execute("INSERT INTO chats (title, system, created) VALUES (?, ?, ?)", ("", system, time.time()))
        self.db.commit()
        return int(cur.lastrowid)

    def last_chat(self) -> int | None:
        row = self.db.execute("SELECT id FROM chats ORDER BY id DESC LIMIT 1").fetchone()
        return int(row[0]) if row else None

    def add(self, chat: int, role: str, content: str) -> None:
        self.db.execute("INSERT INTO messages (chat, role, content, created) VALUES (?, ?, ?, ?)",
                        (chat, role, content, time.time()))
        if role == "user":
            self.db.execute("UPDATE chats SET title = ? WHERE id = ? AND title = ''", (content[:60], chat))
        self.db.commit()

    def messages(self, chat: int) -> list[tuple[str, str]]:
        return [(r, c) for r, c in self.db.execute(
            "SELECT role, content FROM messages WHERE chat = ? ORDER BY id", (chat,))]

    def pop_unanswered(self, chat: int) -> str | None:
        """The chat's last message when it is a question without a reply (the app was closed or killed while
        answering it, or the reply failed): taken out of the history and returned, for the prompt box."""
        row = self.db.execute("SELECT id, role, content FROM messages WHERE chat = ? ORDER BY id DESC LIMIT 1",
                              (chat,)).fetchone()
        if row is None or row[1] != "user":
            return None
        self.db.execute("DELETE FROM messages WHERE id = ?", (row[0],))
        self.db.commit()
        return str(row[2])

    def drop_last_user_message(self, chat: int) -> None:
        """A question taken back (Esc before any reply text): the chat's last user message goes."""
        self.db.execute("DELETE FROM messages WHERE id = (SELECT MAX(id) FROM messages WHERE chat = ? AND "
                        "role = 'user')", (chat,))
        self.db.commit()

    def system(self, chat: int) -> str:
        row = self.db.execute("SELECT system FROM chats WHERE id = ?", (chat,)).fetchone()
        return row[0] if row else ""

    def set_system(self, chat: int, text: str) -> None:
        self.db.execute("UPDATE chats SET system = ? WHERE id = ?", (text, chat))
        self.db.commit()

    def export_markdown(self, chat: int) -> str:
        out = []
        sys_prompt = self.system(chat)
        if sys_prompt:
            out.append(f"> system: {sys_prompt}\n")
        for role, content in self.messages(chat):
            out.append(f"## {role}\n\n{content}\n")
        return "\n".join(out)

    def close(self) -> None:
        self.db.close()
