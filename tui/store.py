"""Chat history in SQLite under $XDG_DATA_HOME/moeslots/ (schema version in PRAGMA user_version).

Schema 2 (issue 22) adds each chat's sampling settings (temperature, top-p, seed); a schema-1 file is upgraded in
place on open. Chats are listed by last activity and searched by title and message text (the chat list, Ctrl+L).
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from pathlib import Path

from .. import configfile
from ..engine.api import Sampling

SCHEMA = 2
TITLE_MAX = 60


def data_dir() -> Path:
    return configfile.data_dir()


@dataclasses.dataclass(frozen=True)
class ChatInfo:
    id: int
    title: str               # "" until the first question (or a rename)
    created: float
    updated: float           # the last message's time (created when none)
    messages: int


class Store:
    def __init__(self, path: Path | None = None):
        self.path = path or data_dir() / "chats.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, check_same_thread=False)
        v = self.db.execute("PRAGMA user_version").fetchone()[0]
        if v > SCHEMA:
            raise RuntimeError(f"{self.path} was written by a newer moeslots (schema {v})")
        if v == 0:
            self.db.executescript("""
                CREATE TABLE IF NOT EXISTS chats (id INTEGER PRIMARY KEY, title TEXT, system TEXT, created REAL);
                CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, chat INTEGER REFERENCES chats(id),
                    role TEXT, content TEXT, created REAL);
                PRAGMA user_version = 1;
            """)
            v = 1
        if v == 1:
            self.db.executescript("""
                BEGIN;
                ALTER TABLE chats ADD COLUMN temperature REAL NOT NULL DEFAULT 0;
                ALTER TABLE chats ADD COLUMN top_p REAL NOT NULL DEFAULT 1;
                ALTER TABLE chats ADD COLUMN seed INTEGER;
                PRAGMA user_version = 2;
                COMMIT;
            """)

    # -- chats -------------------------------------------------------------------------------------------------

    def new_chat(self, system: str = "", sampling: Sampling | None = None) -> int:
        s = sampling or Sampling()
        cur = self.db.execute("INSERT INTO chats (title, system, created, temperature, top_p, seed) VALUES "
                              "(?, ?, ?, ?, ?, ?)", ("", system, time.time(), s.temperature, s.top_p, s.seed))
        self.db.commit()
        return int(cur.lastrowid or 0)

    def last_chat(self) -> int | None:
        row = self.db.execute("SELECT id FROM chats ORDER BY id DESC LIMIT 1").fetchone()
        return int(row[0]) if row else None

    def exists(self, chat: int) -> bool:
        return self.db.execute("SELECT 1 FROM chats WHERE id = ?", (chat,)).fetchone() is not None

    def chats(self, query: str = "") -> list[ChatInfo]:
        """Chats with messages, most recently active first; `query`: those whose title or any message contains it
        (case-insensitive for ASCII)."""
        sql = ("SELECT c.id, COALESCE(c.title, ''), c.created, COALESCE(MAX(m.created), c.created), COUNT(m.id) "
               "FROM chats c JOIN messages m ON m.chat = c.id")
        args: tuple[str, ...] = ()
        if query.strip():
            like = "%" + query.strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            sql += (" WHERE c.title LIKE ? ESCAPE '\\' OR c.id IN "
                    "(SELECT chat FROM messages WHERE content LIKE ? ESCAPE '\\')")
            args = (like, like)
        sql += " GROUP BY c.id ORDER BY 4 DESC, c.id DESC"
        return [ChatInfo(int(i), t, float(c), float(u), int(n)) for i, t, c, u, n in self.db.execute(sql, args)]

    def info(self, chat: int) -> ChatInfo | None:
        row = self.db.execute("SELECT c.id, COALESCE(c.title, ''), c.created, COALESCE(MAX(m.created), c.created), "
                              "COUNT(m.id) FROM chats c LEFT JOIN messages m ON m.chat = c.id WHERE c.id = ? "
                              "GROUP BY c.id", (chat,)).fetchone()
        return ChatInfo(int(row[0]), row[1], float(row[2]), float(row[3]), int(row[4])) if row else None

    def rename(self, chat: int, title: str) -> None:
        title = " ".join(title.split())[:TITLE_MAX]
        if not title:
            raise ValueError("a chat's name cannot be empty")
        self.db.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat))
        self.db.commit()

    def delete(self, chat: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM messages WHERE chat = ?", (chat,))
            self.db.execute("DELETE FROM chats WHERE id = ?", (chat,))

    # -- messages ----------------------------------------------------------------------------------------------

    def add(self, chat: int, role: str, content: str) -> None:
        self.db.execute("INSERT INTO messages (chat, role, content, created) VALUES (?, ?, ?, ?)",
                        (chat, role, content, time.time()))
        if role == "user":
            self.db.execute("UPDATE chats SET title = ? WHERE id = ? AND title = ''",
                            (" ".join(content.split())[:TITLE_MAX], chat))
        self.db.commit()

    def messages(self, chat: int) -> list[tuple[str, str]]:
        return [(r, c) for r, c in self.db.execute(
            "SELECT role, content FROM messages WHERE chat = ? ORDER BY id", (chat,))]

    def _last(self, chat: int) -> tuple[int, str, str] | None:
        row = self.db.execute("SELECT id, role, content FROM messages WHERE chat = ? ORDER BY id DESC LIMIT 1",
                              (chat,)).fetchone()
        return (int(row[0]), str(row[1]), str(row[2])) if row else None

    def pop_unanswered(self, chat: int) -> str | None:
        """The chat's last message when it is a question without a reply (the app was closed or killed while
        answering it, or the reply failed): taken out of the history and returned, for the prompt box."""
        last = self._last(chat)
        if last is None or last[1] != "user":
            return None
        self.db.execute("DELETE FROM messages WHERE id = ?", (last[0],))
        self.db.commit()
        return last[2]

    def drop_last_user_message(self, chat: int) -> None:
        """A question taken back (Esc before any reply text): the chat's last user message goes."""
        self.db.execute("DELETE FROM messages WHERE id = (SELECT MAX(id) FROM messages WHERE chat = ? AND "
                        "role = 'user')", (chat,))
        self.db.commit()

    def drop_last_reply(self, chat: int) -> str | None:
        """Regenerate: the chat's last message when it is an answer, taken out; its text (None: no answer last)."""
        last = self._last(chat)
        if last is None or last[1] != "assistant":
            return None
        self.db.execute("DELETE FROM messages WHERE id = ?", (last[0],))
        self.db.commit()
        return last[2]

    def take_last_question(self, chat: int) -> str | None:
        """Edit-last: the chat's last question and what followed it (its answer), taken out; the question's text."""
        row = self.db.execute("SELECT id, content FROM messages WHERE chat = ? AND role = 'user' ORDER BY id DESC "
                              "LIMIT 1", (chat,)).fetchone()
        if row is None:
            return None
        self.db.execute("DELETE FROM messages WHERE chat = ? AND id >= ?", (chat, row[0]))
        self.db.commit()
        return str(row[1])

    # -- per-chat settings ---------------------------------------------------------------------------------------

    def system(self, chat: int) -> str:
        row = self.db.execute("SELECT system FROM chats WHERE id = ?", (chat,)).fetchone()
        return row[0] if row else ""

    def set_system(self, chat: int, text: str) -> None:
        self.db.execute("UPDATE chats SET system = ? WHERE id = ?", (text, chat))
        self.db.commit()

    def sampling(self, chat: int) -> Sampling:
        row = self.db.execute("SELECT temperature, top_p, seed FROM chats WHERE id = ?", (chat,)).fetchone()
        if row is None:
            return Sampling()
        s = Sampling(float(row[0]), float(row[1]), None if row[2] is None else int(row[2]))
        return Sampling() if s.problem() else s          # a damaged row: greedy, never a crash

    def set_sampling(self, chat: int, s: Sampling) -> None:
        problem = s.problem()
        if problem:
            raise ValueError(problem)
        self.db.execute("UPDATE chats SET temperature = ?, top_p = ?, seed = ? WHERE id = ?",
                        (s.temperature, s.top_p, s.seed, chat))
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
