"""Atomic file writes that leave the old file whole on any failure (a full disk, an interrupt) and give the new file
the permissions a plain open() would: those of the file it replaces, else 0666 less the umask. tempfile.mkstemp makes
0600 files, which a rename would otherwise carry over to every profile and config written."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import threading
from pathlib import Path
from typing import IO, Iterator

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux: /proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:                 # elsewhere: set and restore (another thread creating a file meanwhile is rare)
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def new_file_mode(path: Path) -> int:
    """What open(path, "w") would leave: the mode of the existing file, else 0666 less the umask."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o666 & ~current_umask()


@contextlib.contextmanager
def replace(path: Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """`with replace(p) as fh: fh.write(...)`: written to a temporary file in p's folder, flushed to disk and renamed
    over p only when the block ends without an exception. OSError (IsADirectoryError for a folder) otherwise."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file name", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as fh:
            os.fchmod(fh.fileno(), new_file_mode(path))
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
