"""Chat history in SQLite under $XDG_DATA_HOME/moeslots/ (schema version in PRAGMA user_version).

Schema 2 adds each chat's sampling (temperature, top-p, seed), 3 the model it was made with, 4 top-k, min-p, the repeat
penalty and its window and max tokens (engine.api.Sampling); an older file is upgraded in place on open. Chats are
listed by last activity and searched by title and message text (Ctrl+L).

A history that cannot be written never stops the chat (every database call goes through _do): a read-only file or
folder is opened read-only (copied into memory, so chatting works; nothing is saved, one notice says so); a damaged
file is moved aside to `chats.sqlite.damaged-<time>` and a fresh history starts (a notice); a write that fails
mid-session (a full disk, an I/O error) moves the history into memory (one notice) and the chat goes on there.
What cannot be handled at start-up (a newer schema, a file that cannot be opened) is one HistoryError line; notices
wait in `notices` until the app shows them."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, TypeVar, cast

from .. import configfile
from ..engine.api import Sampling

SCHEMA = 4
TITLE_MAX = 60
_CORRUPT, _NOTADB = 11, 26          # SQLite's primary result codes for a damaged file / not a database at all
T = TypeVar("T")
_TYPED = [(f.name, float if isinstance(f.default, float) else int) for f in dataclasses.fields(Sampling)]
_SAMPLING = ", ".join(c for c, _ in _TYPED)      # a chat's sampling columns, in Sampling's field order


def data_dir() -> Path:
    return configfile.data_dir()


class HistoryError(Exception):
    """The history cannot be opened at all: one line naming the file and what to do (the CLI: exit code 2)."""


class _Damaged(sqlite3.DatabaseError):
    """PRAGMA quick_check found damage that reading the header did not."""


@dataclasses.dataclass(frozen=True)
class ChatInfo:
    id: int
    title: str               # "" until the first question (or a rename)
    created: float
    updated: float           # the last message's time (created when none)
    messages: int
    model: str = ""          # the model file it was made with ("" for chats from before it was kept)


def _damaged(e: sqlite3.Error) -> bool:
    """The file is not (any more) a readable database, as opposed to one that cannot be reached or written."""
    code = getattr(e, "sqlite_errorcode", None)
    if isinstance(e, _Damaged):
        return True
    if code is not None:
        return code & 0xFF in (_CORRUPT, _NOTADB)
    return type(e) is sqlite3.DatabaseError          # (OperationalError: locked, read-only, full, I/O)


def _check(db: sqlite3.Connection, path: Path) -> int:
    """db's schema version, its pages checked (a damaged file raises here, at start, not mid-chat)."""
    v = int(db.execute("PRAGMA user_version").fetchone()[0])
    if v > SCHEMA:
        raise HistoryError(f"{path} was written by a newer moeslots (history schema {v}, this one reads {SCHEMA}): "
                           "update moeslots, or move the file aside to start a fresh history")
    problems = [str(r[0]) for r in db.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise _Damaged(f"database disk image is malformed: {problems[0]}")
    return v


def _schema(db: sqlite3.Connection, path: Path) -> None:
    """Check db (_check); create its tables or upgrade them to SCHEMA."""
    v = _check(db, path)
    if v == 0:
        db.executescript("""
            CREATE TABLE IF NOT EXISTS chats (id INTEGER PRIMARY KEY, title TEXT, system TEXT, created REAL);
            CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, chat INTEGER REFERENCES chats(id),
                role TEXT, content TEXT, created REAL);
            PRAGMA user_version = 1;
        """)
        v = 1
    if v == 1:
        db.executescript("""
            BEGIN;
            ALTER TABLE chats ADD COLUMN temperature REAL NOT NULL DEFAULT 0;
            ALTER TABLE chats ADD COLUMN top_p REAL NOT NULL DEFAULT 1;
            ALTER TABLE chats ADD COLUMN seed INTEGER;
            PRAGMA user_version = 2;
            COMMIT;
        """)
        v = 2
    if v == 2:
        db.executescript("""
            BEGIN;
            ALTER TABLE chats ADD COLUMN model TEXT NOT NULL DEFAULT '';
            PRAGMA user_version = 3;
            COMMIT;
        """)
        v = 3
    if v == 3:                                   # the defaults: as the chat was sampled before (Sampling's)
        db.executescript("""
            BEGIN;
            ALTER TABLE chats ADD COLUMN top_k INTEGER NOT NULL DEFAULT 0;
            ALTER TABLE chats ADD COLUMN min_p REAL NOT NULL DEFAULT 0;
            ALTER TABLE chats ADD COLUMN repeat_penalty REAL NOT NULL DEFAULT 1;
            ALTER TABLE chats ADD COLUMN repeat_last_n INTEGER NOT NULL DEFAULT 64;
            ALTER TABLE chats ADD COLUMN max_tokens INTEGER NOT NULL DEFAULT 0;
            PRAGMA user_version = 4;
            COMMIT;
        """)


def _memory(path: Path, source: sqlite3.Connection | None = None) -> sqlite3.Connection:
    """An in-memory history: a copy of `source` (its schema upgraded when older), else an empty one."""
    mem = sqlite3.connect(":memory:", check_same_thread=False)
    if source is not None:
        source.backup(mem)
    _schema(mem, path)
    return mem


def _close(db: sqlite3.Connection | None) -> None:
    try:
        if db is not None:
            db.close()
    except sqlite3.Error:
        pass


class Store:
    def __init__(self, path: Path | None = None):
        self.path = path or data_dir() / "chats.sqlite"
        self.notices: list[str] = []     # said once by the app (take_notices): read-only, moved aside, not saved
        self.saving = True               # False: the history lives in memory only, nothing more reaches the file
        self.db = self._open()

    # -- opening, and what happens when the file fails ---------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except PermissionError:
            pass                                         # a read-only location: below, read-only or memory only
        except OSError as e:
            raise HistoryError(f"cannot create the chat history's folder {folder}: {e.strerror}") from None
        writable = (folder.is_dir() and os.access(folder, os.W_OK)
                    and (not self.path.exists() or os.access(self.path, os.W_OK)))
        if not writable:
            return self._open_read_only()
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(self.path, check_same_thread=False)
            _schema(db, self.path)
            return db
        except HistoryError:
            _close(db)
            raise
        except sqlite3.Error as e:
            _close(db)
            if _damaged(e):
                return self._move_aside(e)
            raise HistoryError(f"cannot open the chat history {self.path}: {e} (check its folder's free space and "
                               "permissions, or move the file aside to start a fresh history)") from None

    def _open_read_only(self) -> sqlite3.Connection:
        """The file (or folder) cannot be written: its chats read into memory, new ones kept there, one notice."""
        self.saving = False
        if not self.path.exists():
            self.notices.append(f"chat history: {self.path.parent} cannot be written: chats are kept in memory "
                                "only, nothing is saved this session")
            return _memory(self.path)
        src: sqlite3.Connection | None = None
        try:
            src = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
            _check(src, self.path)
            mem = _memory(self.path, src)                # (a schema-1 file: upgraded in the copy)
        except sqlite3.Error as e:
            if _damaged(e):                              # not ours to move aside
                raise HistoryError(f"the chat history {self.path} is damaged ({e}) and read-only: move it aside "
                                   f"(mv '{self.path}' '{self.path}.damaged') or make it writable") from None
            raise HistoryError(f"cannot open the chat history {self.path} (read-only): {e}") from None
        finally:
            _close(src)
        self.notices.append(f"chat history: {self.path} is read-only: opened read-only; new messages are kept in "
                            "memory only, not saved")
        return mem

    def _move_aside(self, e: sqlite3.Error) -> sqlite3.Connection:
        """A damaged file goes to chats.sqlite.damaged-<time> (with its journal), a fresh history takes its place."""
        aside = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        n = 1
        while aside.exists():                            # (twice in one second)
            aside, n = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{n}"), n + 1
        try:
            os.replace(self.path, aside)
            for tail in ("-journal", "-wal", "-shm"):    # a journal left here would be played into the fresh file
                side = self.path.with_name(self.path.name + tail)
                if side.exists():
                    os.replace(side, aside.with_name(aside.name + tail))
        except OSError as oe:
            raise HistoryError(f"the chat history {self.path} is damaged ({e}) and could not be moved aside "
                               f"({oe.strerror}): move it aside yourself to start a fresh history") from None
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(self.path, check_same_thread=False)
            _schema(db, self.path)
        except sqlite3.Error as e2:
            _close(db)
            raise HistoryError(f"cannot start a fresh chat history {self.path}: {e2}") from None
        self.notices.append(f"chat history: {self.path} was damaged ({e}): moved aside to {aside.name}; a fresh "
                            "history starts")
        return db

    def _fall_back(self, e: sqlite3.Error) -> None:
        """The file failed mid-session: what it holds is copied into memory (an empty history if it cannot be read
        any more) and the chat goes on there; one notice."""
        try:
            self.db.rollback()
        except sqlite3.Error:
            pass
        try:
            mem, lost = _memory(self.path, self.db), ""
        except sqlite3.Error:
            mem, lost = _memory(self.path), " (its chats could not be read back: an empty one for now)"
        _close(self.db)
        self.db, self.saving = mem, False
        self.notices.append(f"chat history: could not write {self.path} ({e}): chats go on in memory{lost}, "
                            "nothing more is saved this session")

    def _do(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """fn on the history; when the file fails, fn again on the in-memory history that takes its place."""
        try:
            return fn(self.db)
        except sqlite3.DatabaseError as e:               # (not ProgrammingError: a bug, e.g. a closed store)
            if not self.saving:
                raise
            self._fall_back(e)
            return fn(self.db)

    def take_notices(self) -> list[str]:
        """What the history has to say that was not said yet (each once)."""
        out, self.notices = self.notices, []
        return out

    # -- chats -------------------------------------------------------------------------------------------------

    def new_chat(self, system: str = "", sampling: Sampling | None = None, model: str = "") -> int:
        s = sampling or Sampling()

        def write(db: sqlite3.Connection) -> int:
            with db:
                cur = db.execute(f"INSERT INTO chats (title, system, created, model, {_SAMPLING}) "
                                 f"VALUES (?, ?, ?, ?{', ?' * len(_TYPED)})",
                                 ("", system, time.time(), model, *dataclasses.astuple(s)))
            return int(cur.lastrowid or 0)
        return self._do(write)

    def last_chat(self, model: str | None = None) -> int | None:
        """The newest chat (made with `model`, when given: a chat belongs to the model it was made with)."""
        sql, args = "SELECT id FROM chats", cast("tuple[str, ...]", ())
        if model is not None:
            sql, args = sql + " WHERE model = ?", (model,)
        row = self._do(lambda db: db.execute(sql + " ORDER BY id DESC LIMIT 1", args).fetchone())
        return int(row[0]) if row else None

    def model_of(self, chat: int) -> str:
        row = self._do(lambda db: db.execute("SELECT model FROM chats WHERE id = ?", (chat,)).fetchone())
        return str(row[0]) if row else ""

    def exists(self, chat: int) -> bool:
        return self._do(lambda db: db.execute("SELECT 1 FROM chats WHERE id = ?", (chat,)).fetchone()) is not None

    def chats(self, query: str = "") -> list[ChatInfo]:
        """Chats with messages, most recently active first; `query`: those whose title or any message contains it
        (case-insensitive for ASCII)."""
        sql = ("SELECT c.id, COALESCE(c.title, ''), c.created, COALESCE(MAX(m.created), c.created), COUNT(m.id), "
               "c.model FROM chats c JOIN messages m ON m.chat = c.id")
        args: tuple[str, ...] = ()
        if query.strip():
            like = "%" + query.strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            sql += (" WHERE c.title LIKE ? ESCAPE '\\' OR c.id IN "
                    "(SELECT chat FROM messages WHERE content LIKE ? ESCAPE '\\')")
            args = (like, like)
        sql += " GROUP BY c.id ORDER BY 4 DESC, c.id DESC"
        rows = self._do(lambda db: db.execute(sql, args).fetchall())
        return [ChatInfo(int(i), t, float(c), float(u), int(n), str(mo)) for i, t, c, u, n, mo in rows]

    def info(self, chat: int) -> ChatInfo | None:
        row = self._do(lambda db: db.execute(
            "SELECT c.id, COALESCE(c.title, ''), c.created, COALESCE(MAX(m.created), c.created), COUNT(m.id), c.model "
            "FROM chats c LEFT JOIN messages m ON m.chat = c.id WHERE c.id = ? GROUP BY c.id", (chat,)).fetchone())
        return ChatInfo(int(row[0]), row[1], float(row[2]), float(row[3]), int(row[4]), str(row[5])) if row else None

    def rename(self, chat: int, title: str) -> None:
        title = " ".join(title.split())[:TITLE_MAX]
        if not title:
            raise ValueError("a chat's name cannot be empty")
        self._write("UPDATE chats SET title = ? WHERE id = ?", (title, chat))

    def delete(self, chat: int) -> None:
        def write(db: sqlite3.Connection) -> None:
            with db:
                db.execute("DELETE FROM messages WHERE chat = ?", (chat,))
                db.execute("DELETE FROM chats WHERE id = ?", (chat,))
        self._do(write)

    # -- messages ----------------------------------------------------------------------------------------------

    def add(self, chat: int, role: str, content: str, *, retry: bool = True) -> bool:
        """The message into the chat. retry=False (a question still in the prompt box): when the file refuses it,
        the history moves to memory without it and False says so, the caller keeping the text to send again."""
        def write(db: sqlite3.Connection) -> None:
            with db:
                db.execute("INSERT INTO messages (chat, role, content, created) VALUES (?, ?, ?, ?)",
                           (chat, role, content, time.time()))
                if role == "user":
                    db.execute("UPDATE chats SET title = ? WHERE id = ? AND title = ''",
                               (" ".join(content.split())[:TITLE_MAX], chat))
        if retry or not self.saving:
            self._do(write)
            return True
        try:
            write(self.db)
            return True
        except sqlite3.DatabaseError as e:
            self._fall_back(e)
            return False

    def messages(self, chat: int) -> list[tuple[str, str]]:
        rows = self._do(lambda db: db.execute(
            "SELECT role, content FROM messages WHERE chat = ? ORDER BY id", (chat,)).fetchall())
        return [(str(r), str(c)) for r, c in rows]

    def _last(self, chat: int) -> tuple[int, str, str] | None:
        row = self._do(lambda db: db.execute(
            "SELECT id, role, content FROM messages WHERE chat = ? ORDER BY id DESC LIMIT 1", (chat,)).fetchone())
        return (int(row[0]), str(row[1]), str(row[2])) if row else None

    def _write(self, sql: str, args: tuple[object, ...]) -> None:
        """One statement that changes the history, committed (or, when the file fails, run in memory)."""
        def write(db: sqlite3.Connection) -> None:
            with db:
                db.execute(sql, args)
        self._do(write)

    def pop_unanswered(self, chat: int) -> str | None:
        """The chat's last message when it is a question without a reply (the app was closed or killed while
        answering it, or the reply failed): taken out of the history and returned, for the prompt box."""
        last = self._last(chat)
        if last is None or last[1] != "user":
            return None
        self._write("DELETE FROM messages WHERE id = ?", (last[0],))
        return last[2]

    def drop_last_user_message(self, chat: int) -> None:
        """A question taken back (Esc before any reply text): the chat's last user message goes."""
        self._write("DELETE FROM messages WHERE id = (SELECT MAX(id) FROM messages WHERE chat = ? AND "
                    "role = 'user')", (chat,))

    def drop_last_reply(self, chat: int) -> str | None:
        """Regenerate: the chat's last message when it is an answer, taken out; its text (None: no answer last)."""
        last = self._last(chat)
        if last is None or last[1] != "assistant":
            return None
        self._write("DELETE FROM messages WHERE id = ?", (last[0],))
        return last[2]

    def take_last_question(self, chat: int) -> str | None:
        """Edit-last: the chat's last question and what followed it (its answer), taken out; the question's text."""
        row = self._do(lambda db: db.execute("SELECT id, content FROM messages WHERE chat = ? AND role = 'user' "
                                             "ORDER BY id DESC LIMIT 1", (chat,)).fetchone())
        if row is None:
            return None
        self._write("DELETE FROM messages WHERE chat = ? AND id >= ?", (chat, row[0]))
        return str(row[1])

    # -- per-chat settings ---------------------------------------------------------------------------------------

    def system(self, chat: int) -> str:
        row = self._do(lambda db: db.execute("SELECT system FROM chats WHERE id = ?", (chat,)).fetchone())
        return str(row[0] or "") if row else ""

    def set_system(self, chat: int, text: str) -> None:
        self._write("UPDATE chats SET system = ? WHERE id = ?", (text, chat))

    def sampling(self, chat: int) -> Sampling:
        row = self._do(lambda db: db.execute(f"SELECT {_SAMPLING} FROM chats WHERE id = ?", (chat,)).fetchone())
        try:                                             # SQLite keeps any type: each as Sampling types it
            values: list[Any] = [None if v is None else kind(v) for (_, kind), v in zip(_TYPED, row or ())]
            s = Sampling(*values)
        except (TypeError, ValueError):
            return Sampling()
        return Sampling() if s.problem() else s          # a damaged row (or none): greedy, never a crash

    def set_sampling(self, chat: int, s: Sampling) -> None:
        problem = s.problem()
        if problem:
            raise ValueError(problem)
        self._write(f"UPDATE chats SET {', '.join(f'{c} = ?' for c, _ in _TYPED)} WHERE id = ?",
                    (*dataclasses.astuple(s), chat))

    def export_markdown(self, chat: int) -> str:
        out = []
        sys_prompt = self.system(chat)
        if sys_prompt:
            out.append(f"> system: {sys_prompt}\n")
        for role, content in self.messages(chat):
            out.append(f"## {role}\n\n{content}\n")
        return "\n".join(out)

    def close(self) -> None:
        _close(self.db)
