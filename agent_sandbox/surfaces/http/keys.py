"""API keys for the gateway: created with a name, listed, revoked; hashed at rest.

A key is a random token shown once at creation; only its sha256 is stored (SQLite, mode
0600), so a leaked key file reveals no usable secret. Each key has an id (``key-...``) that
is the owner of the sandboxes it creates, an admin flag, its own quotas, and optionally its
own network ceiling (the most network its sandboxes may have; none: the gateway's).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from agent_sandbox.config.settings import Settings
from agent_sandbox.core import network as netpolicy
from agent_sandbox.core import private_db
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError

TOKEN_PREFIX = "abx_"
# What E2B's SDKs expect a key to look like (older ones check it): `e2b_` and 40 hex digits.
E2B_PREFIX = "e2b_"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    admin INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    revoked_at REAL,
    max_sandboxes INTEGER NOT NULL,
    max_commands INTEGER NOT NULL,
    network_ceiling TEXT
);
CREATE TABLE IF NOT EXISTS volumes (
    volume_id TEXT PRIMARY KEY,
    key_id TEXT NOT NULL
);
"""
_COLUMNS = ("id, name, admin, created_at, revoked_at, max_sandboxes, max_commands, "
            "network_ceiling")


@dataclass(frozen=True)
class ApiKey:
    id: str
    name: str
    admin: bool
    created_at: float
    revoked_at: float | None
    max_sandboxes: int
    max_commands: int
    # The most network this key's sandboxes may have; None: only the gateway's ceiling.
    network_ceiling: netpolicy.NetworkPolicy | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def public(self) -> dict[str, object]:
        """What listing shows: everything but the secret (which is not stored anyway)."""
        return {"id": self.id, "name": self.name, "admin": self.admin,
                "created_at": self.created_at, "revoked": self.revoked,
                "max_sandboxes": self.max_sandboxes, "max_commands": self.max_commands,
                "network_ceiling": None if self.network_ceiling is None
                else self.network_ceiling.model_dump(mode="json")}


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class KeyStore:
    """``path`` defaults to the settings' key file; the settings' quotas are what a new key
    (and each daemon user) gets unless told otherwise."""

    def __init__(self, path: str | Path | None = None, *,
                 settings: Settings | None = None) -> None:
        settings = settings or Settings()
        self.path = Path(path) if path else settings.keys_file
        self.default_max_sandboxes = settings.gateway_max_sandboxes
        self.default_max_commands = settings.gateway_max_commands
        # 0600 with its -wal/-shm: hashes are not secrets, but names and quotas are
        # nobody else's business.
        private_db.connect(self.path).close()
        self._local = threading.local()
        with self._db() as db:
            db.executescript(_SCHEMA)
            columns = {row[1] for row in db.execute("PRAGMA table_info(keys)")}
            if "network_ceiling" not in columns:  # a key file from before network ceilings
                try:
                    db.execute("ALTER TABLE keys ADD COLUMN network_ceiling TEXT")
                except sqlite3.OperationalError:  # another process added it just now
                    if "network_ceiling" not in {
                            row[1] for row in db.execute("PRAGMA table_info(keys)")}:
                        raise

    def _db(self) -> sqlite3.Connection:
        # One connection per thread: the gateway checks keys from its worker threads.
        return private_db.per_thread(self._local, self.path)

    def create(self, name: str, *, admin: bool = False,
               max_sandboxes: int | None = None, max_commands: int | None = None,
               network_ceiling: object = None, e2b: bool = False) -> tuple[ApiKey, str]:
        """A new key and its token (the only time the token is seen). ``network_ceiling``:
        anything ``netpolicy.parse`` takes; None leaves the key with the gateway's. ``e2b``:
        a token shaped like E2B's, for SDKs that check the shape (any key works on the E2B
        API)."""
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise InvalidArgumentError("a key needs a name of 1-200 characters")
        limits = (self.default_max_sandboxes if max_sandboxes is None else max_sandboxes,
                  self.default_max_commands if max_commands is None else max_commands)
        if any(not isinstance(v, int) or v < 0 for v in limits):
            raise InvalidArgumentError("quotas must be whole numbers >= 0")
        ceiling = None if network_ceiling is None else netpolicy.parse(network_ceiling)
        stored = None if ceiling is None else json.dumps(ceiling.model_dump(mode="json"))
        key_id = "key-" + secrets.token_hex(6)
        token = (E2B_PREFIX + secrets.token_hex(20) if e2b
                 else TOKEN_PREFIX + secrets.token_urlsafe(32))
        now = time.time()
        name = name.strip()
        # One statement: two creates of one name at once cannot both pass the check.
        added = self._db().execute(
            "INSERT INTO keys (id, name, hash, admin, created_at, revoked_at, max_sandboxes,"
            " max_commands, network_ceiling) SELECT ?, ?, ?, ?, ?, NULL, ?, ?, ? WHERE NOT "
            "EXISTS (SELECT 1 FROM keys WHERE name = ? AND revoked_at IS NULL)",
            (key_id, name, _hash(token), int(admin), now, *limits, stored, name)).rowcount
        if not added:
            taken = self._named(name, live_only=True)
            ids = ", ".join(k.id for k in taken) or "?"
            raise InvalidArgumentError(
                f"a live key named {name!r} exists already ({ids}); names pick a key for "
                f"`abx keys revoke`, so choose another name (or revoke {ids} first)")
        return ApiKey(key_id, name, admin, now, None, *limits, ceiling), token

    def list(self) -> list[ApiKey]:
        rows = self._db().execute(
            f"SELECT {_COLUMNS} FROM keys ORDER BY created_at").fetchall()
        return [_key(r) for r in rows]

    def _named(self, name: str, live_only: bool = False) -> list[ApiKey]:
        rows = self._db().execute(
            f"SELECT {_COLUMNS} FROM keys WHERE name = ? ORDER BY created_at",
            (name,)).fetchall()
        keys = [_key(r) for r in rows]
        return [k for k in keys if not k.revoked] if live_only else keys

    def get(self, key_id: str) -> ApiKey:
        """By id, or by a name only one key has (if several do, the one live key among
        them); an ambiguous name is refused with the ids to choose from."""
        row = self._db().execute(
            f"SELECT {_COLUMNS} FROM keys WHERE id = ?", (key_id,)).fetchone()
        if row is not None:
            return _key(row)
        named = self._named(key_id)
        if len(named) > 1:
            live = [k for k in named if not k.revoked]
            if len(live) == 1:
                return live[0]
            ids = ", ".join(f"{k.id} ({'revoked' if k.revoked else 'live'})" for k in named)
            raise InvalidArgumentError(f"{len(named)} API keys are named {key_id!r}: {ids}; "
                                       "give the id instead (`abx keys list` shows them)")
        if not named:
            raise NotFoundError(f"API key {key_id!r} not found (give a key id or name; "
                                "`abx keys list` shows them)")
        return named[0]

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke by id (or name); effective on the gateway's next request."""
        key = self.get(key_id)
        self._db().execute("UPDATE keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                           (time.time(), key.id))
        return self.get(key.id)

    def authenticate(self, token: str) -> ApiKey | None:
        """The live key a token stands for, or None (unknown or revoked)."""
        row = self._db().execute(
            f"SELECT {_COLUMNS} FROM keys WHERE hash = ?", (_hash(token),)).fetchone()
        if row is None or row[4] is not None:
            return None
        return _key(row)

    def any_keys(self) -> bool:
        """Whether any key was ever made (revoked ones count: revoking the last key must
        not reopen the gateway)."""
        return self._db().execute("SELECT 1 FROM keys LIMIT 1").fetchone() is not None

    def live_keys(self) -> int:
        return self._db().execute(
            "SELECT COUNT(*) FROM keys WHERE revoked_at IS NULL").fetchone()[0]

    # volumes outlive their sandboxes, so their owner is remembered here
    def own_volume(self, volume_id: str, key_id: str) -> None:
        self._db().execute("INSERT OR IGNORE INTO volumes (volume_id, key_id) VALUES (?, ?)",
                           (volume_id, key_id))

    def volume_owner(self, volume_id: str) -> str | None:
        row = self._db().execute("SELECT key_id FROM volumes WHERE volume_id = ?",
                                 (volume_id,)).fetchone()
        return None if row is None else row[0]

    def forget_volume(self, volume_id: str) -> None:
        self._db().execute("DELETE FROM volumes WHERE volume_id = ?", (volume_id,))


def _ceiling(stored: str | None) -> netpolicy.NetworkPolicy | None:
    if stored is None:
        return None
    try:
        return netpolicy.parse(json.loads(stored))
    except (ValueError, InvalidArgumentError):
        # Unreadable (edited by hand?): the narrowest ceiling, never a wider one.
        return netpolicy.NetworkPolicy()


def _key(row: tuple) -> ApiKey:
    return ApiKey(id=row[0], name=row[1], admin=bool(row[2]), created_at=row[3],
                  revoked_at=row[4], max_sandboxes=row[5], max_commands=row[6],
                  network_ceiling=_ceiling(row[7]))
