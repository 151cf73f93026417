"""SQLite files that hold secrets (sandbox env values, API keys): 0600 from birth.

SQLite gives a database's ``-wal``, ``-shm`` and ``-journal`` files the mode of the
database file itself, so creating that file 0600 before SQLite opens it is what keeps
all of them private; files left by an older version are narrowed on open.

Nothing here opens (and closes) an existing database file: closing any descriptor of
a file drops every POSIX lock this process holds on it, including the locks of
SQLite connections already open in this process, and then readers see stale data.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
from pathlib import Path

_COMPANIONS = ("", "-wal", "-shm", "-journal")


def connect(path: Path, **kw: object) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        # A new file: nobody in this process can hold a lock on it yet.
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600))
    for suffix in _COMPANIONS:
        name = f"{path}{suffix}"
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(name)
            # The state dir is host-only; lstat keeps a stray link from being followed.
            if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
                os.chmod(name, 0o600)
    return sqlite3.connect(str(path), **kw)  # type: ignore[arg-type]


def per_thread(local: threading.local, path: Path) -> sqlite3.Connection:
    """This thread's connection to ``path`` (WAL, autocommit), made on its first use: a
    server checks from many worker threads, and a connection is not shared between them."""
    conn = getattr(local, "conn", None)
    if conn is None:
        conn = connect(path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        local.conn = conn
    return conn
