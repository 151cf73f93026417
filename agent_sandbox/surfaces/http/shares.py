"""The gateway's port share links (core/shares.py): one row per link in a 0600 SQLite
file beside the keys. A token is 32 random bytes; only its SHA-256 is stored, so the file
does not hold working links. A link names one sandbox and one port, and is checked on
every request: revoked, expired, or its sandbox gone, it is refused."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sqlite3
import threading
import time
from pathlib import Path

from agent_sandbox.core import private_db
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError
from agent_sandbox.core.shares import DEFAULT_SECONDS, MAX_PER_SANDBOX, MAX_SECONDS, PortShare

_SCHEMA = """CREATE TABLE IF NOT EXISTS shares (
    id TEXT PRIMARY KEY, token_hash TEXT NOT NULL UNIQUE, sandbox_id TEXT NOT NULL,
    port INTEGER NOT NULL, owner TEXT NOT NULL, public INTEGER NOT NULL,
    created REAL NOT NULL, expires REAL NOT NULL)"""


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _share(row: tuple) -> PortShare:
    return PortShare(share_id=row[0], sandbox_id=row[2], port=row[3], public=bool(row[5]),
                     created_at=row[6], expires_at=row[7])


class ShareStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        with self._db() as db:
            db.execute(_SCHEMA)

    def _db(self) -> sqlite3.Connection:
        return private_db.per_thread(self._local, self.path)

    def create(self, sandbox_id: str, port: int, owner: str, *, public: bool = False,
               expires_in: float | None = None) -> tuple[PortShare, str]:
        """A new link and its token (the only time the token is seen)."""
        seconds = DEFAULT_SECONDS if expires_in is None else expires_in
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or \
                not 0 < seconds <= MAX_SECONDS:
            raise InvalidArgumentError(f"expires_in must be seconds in (0, {MAX_SECONDS:.0f}]"
                                       f", got {expires_in!r}")
        self.sweep()
        if len(self.list(sandbox_id)) >= MAX_PER_SANDBOX:
            raise InvalidArgumentError(f"a sandbox has at most {MAX_PER_SANDBOX} share links: "
                                       "revoke one first")
        token = secrets.token_urlsafe(32)
        share_id = "shr-" + secrets.token_hex(8)
        now = time.time()
        self._db().execute("INSERT INTO shares VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           (share_id, _hash(token), sandbox_id, port, owner, int(public), now,
                            now + seconds))
        return self.get(share_id), token

    def get(self, share_id: str) -> PortShare:
        row = self._db().execute("SELECT * FROM shares WHERE id = ?", (share_id,)).fetchone()
        if row is None or row[7] <= time.time():
            raise NotFoundError(f"share link {share_id[:40]!r} not found (revoked or expired)")
        return _share(row)

    def list(self, sandbox_id: str) -> list[PortShare]:
        rows = self._db().execute("SELECT * FROM shares WHERE sandbox_id = ? AND expires > ? "
                                  "ORDER BY created", (sandbox_id, time.time())).fetchall()
        return [_share(r) for r in rows]

    def revoke(self, sandbox_id: str, share_id: str) -> None:
        cur = self._db().execute("DELETE FROM shares WHERE id = ? AND sandbox_id = ?",
                                 (share_id, sandbox_id))
        if cur.rowcount == 0:
            raise NotFoundError(f"share link {share_id[:40]!r} of {sandbox_id} not found")

    def forget_sandbox(self, sandbox_id: str) -> None:
        self._db().execute("DELETE FROM shares WHERE sandbox_id = ?", (sandbox_id,))

    def sweep(self) -> None:
        self._db().execute("DELETE FROM shares WHERE expires <= ?", (time.time(),))

    def admit(self, share_id: str, token: str | None) -> PortShare | None:
        """The live link ``share_id`` if ``token`` is its token (or it is public)."""
        row = self._db().execute("SELECT * FROM shares WHERE id = ?", (share_id,)).fetchone()
        if row is None or row[7] <= time.time():
            return None
        if row[5] or (token and hmac.compare_digest(row[1], _hash(token))):
            return _share(row)
        return None

    def by_token(self, token: str) -> PortShare | None:
        row = self._db().execute("SELECT * FROM shares WHERE token_hash = ?",
                                 (_hash(token),)).fetchone()
        return _share(row) if row is not None and row[7] > time.time() else None

    def public_for(self, sandbox_id: str, port: int) -> PortShare | None:
        row = self._db().execute(
            "SELECT * FROM shares WHERE sandbox_id = ? AND port = ? AND public = 1 AND "
            "expires > ?", (sandbox_id, port, time.time())).fetchone()
        return _share(row) if row is not None else None
