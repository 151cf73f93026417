"""SQLite files that hold secrets (sandbox env values, API keys): 0600 from birth.

SQLite gives a database's ``-wal``, ``-shm`` and ``-journal`` files the mode of the
database file itself, so creating that file 0600 before SQLite opens it is what keeps
all of them private; files left by an older version are narrowed on open.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

_COMPANIONS = ("", "-wal", "-shm", "-journal")


def connect(path: Path, **kw: object) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.close(fd)
    for suffix in _COMPANIONS:
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(f"{path}{suffix}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
    return sqlite3.connect(str(path), **kw)  # type: ignore[arg-type]
