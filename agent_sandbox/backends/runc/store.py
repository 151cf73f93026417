"""SQLite state: one row per sandbox and per kept volume. Survives any engine restart.

The schema carries its version in ``PRAGMA user_version``: opening a database applies,
in one transaction, every migration step it has not had yet. A database from before
versioning (``user_version`` 0, written by the first schema) is upgraded in place; one
from a newer agent-sandbox is refused untouched.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent_sandbox.core import private_db
from agent_sandbox.core.errors import RuntimeUnavailableError
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import SandboxState
from agent_sandbox.service.record import SandboxRecord

# Migration step N brings a database from user_version N to N + 1, one statement at a
# time (executescript would commit half way). Step 0 is the first schema exactly, with
# IF NOT EXISTS: a version-0 database from before versioning already has its tables.
# Append steps; never edit a released one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    template TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_used REAL NOT NULL,
    timeout REAL NOT NULL,
    persistent INTEGER NOT NULL,
    network INTEGER NOT NULL,
    owner TEXT NOT NULL DEFAULT '',
    volume_id TEXT NOT NULL,
    envs TEXT NOT NULL,
    metadata TEXT NOT NULL,
    limits TEXT NOT NULL,
    layers TEXT NOT NULL,
    helper_pid INTEGER NOT NULL DEFAULT 0
)""",
        """CREATE TABLE IF NOT EXISTS volumes (
    id TEXT PRIMARY KEY,
    size_mb INTEGER NOT NULL,
    created_at REAL NOT NULL,
    attached_to TEXT NOT NULL DEFAULT ''
)""",
    ),
    (  # 1: an end of life (lifetime, on_timeout, keep_volume)
        "ALTER TABLE sandboxes ADD COLUMN lifetime REAL",
        "ALTER TABLE sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'pause'",
        "ALTER TABLE sandboxes ADD COLUMN keep_volume INTEGER NOT NULL DEFAULT 1",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass
class VolumeRow:
    id: str
    size_mb: int
    created_at: float
    attached_to: str = ""


_JSON_FIELDS = ("envs", "metadata", "limits", "layers")


def _policy(stored: object) -> NetworkPolicy:
    """The network column: policy JSON; rows from before policies hold 0 or 1."""
    if isinstance(stored, str):
        return NetworkPolicy.model_validate_json(stored)
    return NetworkPolicy(mode="full" if stored else "off")


class Store:
    def __init__(self, path: Path) -> None:
        self._db = private_db.connect(path, timeout=30, check_same_thread=False,
                                      isolation_level=None)
        self._lock = threading.Lock()
        self._refuse_newer(path)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._migrate(path)

    def _version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _refuse_newer(self, path: Path) -> None:
        version = self._version()
        if version > SCHEMA_VERSION:
            self._db.close()
            raise RuntimeUnavailableError(
                f"{path} was written by a newer agent-sandbox (schema version {version}; "
                f"this one knows up to {SCHEMA_VERSION}): upgrade agent-sandbox, or point "
                "ABX_DATA_DIR at another data dir")

    def _migrate(self, path: Path) -> None:
        if self._version() == SCHEMA_VERSION:
            return
        with self._tx() as db:
            version = self._version()  # another process may have migrated meanwhile
            if version > SCHEMA_VERSION:
                raise RuntimeUnavailableError(f"{path} was upgraded meanwhile by a newer "
                                              f"agent-sandbox (schema version {version})")
            for step in MIGRATIONS[version:]:
                for statement in step:
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # sandboxes -------------------------------------------------------------------------
    def insert_sandbox(self, row: SandboxRecord) -> None:
        data = asdict(row)
        for key in _JSON_FIELDS:
            data[key] = json.dumps(data[key])
        data["network"] = row.network.model_dump_json()
        cols = ", ".join(data)
        marks = ", ".join(f":{k}" for k in data)
        with self._tx() as db:
            db.execute(f"INSERT INTO sandboxes ({cols}) VALUES ({marks})", data)

    def update_sandbox(self, sandbox_id: str, **changes: Any) -> None:
        for key in _JSON_FIELDS:
            if key in changes:
                changes[key] = json.dumps(changes[key])
        if isinstance(changes.get("network"), NetworkPolicy):
            changes["network"] = changes["network"].model_dump_json()
        sets = ", ".join(f"{k} = :{k}" for k in changes)
        with self._tx() as db:
            db.execute(f"UPDATE sandboxes SET {sets} WHERE id = :_id",
                       {**changes, "_id": sandbox_id})

    def touch(self, sandbox_id: str) -> None:
        with self._lock:
            self._db.execute("UPDATE sandboxes SET last_used = ? WHERE id = ?",
                             (time.time(), sandbox_id))

    def claim_pooled(self, template: str, limits: dict[str, Any],
                     **changes: Any) -> str | None:
        """Turn one warm pooled sandbox with these limits into a live one, atomically."""
        for key in _JSON_FIELDS:
            if key in changes:
                changes[key] = json.dumps(changes[key])
        sets = ", ".join(f"{k} = :{k}" for k in changes)
        with self._tx() as db:
            cur = db.execute("SELECT id, limits FROM sandboxes WHERE state = ? AND "
                             "template = ? ORDER BY created_at",
                             (SandboxState.POOLED, template))
            for found_id, found_limits in cur.fetchall():
                if json.loads(found_limits) == limits:
                    db.execute(f"UPDATE sandboxes SET state = :_running, {sets} "
                               "WHERE id = :_id", {**changes, "_id": found_id,
                                                   "_running": SandboxState.RUNNING})
                    return str(found_id)
        return None

    def count_pooled(self, template: str) -> int:
        with self._lock:
            cur = self._db.execute("SELECT COUNT(*) FROM sandboxes WHERE state = ? "
                                   "AND template = ?", (SandboxState.POOLED, template))
            return int(cur.fetchone()[0])

    def delete_sandbox(self, sandbox_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))

    def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        with self._lock:
            cur = self._db.execute("SELECT * FROM sandboxes WHERE id = ?", (sandbox_id,))
            rows = self._rows(cur)
        return rows[0] if rows else None

    def list_sandboxes(self) -> list[SandboxRecord]:
        with self._lock:
            cur = self._db.execute("SELECT * FROM sandboxes ORDER BY created_at")
            return self._rows(cur)

    @staticmethod
    def _rows(cur: sqlite3.Cursor) -> list[SandboxRecord]:
        names = [d[0] for d in cur.description]
        out = []
        for values in cur.fetchall():
            data = dict(zip(names, values, strict=True))
            for key in _JSON_FIELDS:
                data[key] = json.loads(data[key])
            data["persistent"] = bool(data["persistent"])
            data["keep_volume"] = bool(data["keep_volume"])
            data["network"] = _policy(data["network"])
            data["state"] = SandboxState(data["state"])
            out.append(SandboxRecord(**data))
        return out

    # volumes ---------------------------------------------------------------------------
    def upsert_volume(self, row: VolumeRow) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO volumes (id, size_mb, created_at, attached_to) VALUES (?,?,?,?) "
                "ON CONFLICT(id) DO UPDATE SET attached_to = excluded.attached_to",
                (row.id, row.size_mb, row.created_at, row.attached_to),
            )

    def claim_volume(self, volume_id: str, sandbox_id: str) -> VolumeRow | None:
        """Attach a detached volume atomically; ``None`` if missing or in use."""
        with self._tx() as db:
            cur = db.execute("SELECT id, size_mb, created_at, attached_to FROM volumes "
                             "WHERE id = ?", (volume_id,))
            found = cur.fetchone()
            if found is None or found[3]:
                return None
            db.execute("UPDATE volumes SET attached_to = ? WHERE id = ?", (sandbox_id, volume_id))
            return VolumeRow(found[0], found[1], found[2], sandbox_id)

    def release_volume(self, volume_id: str, sandbox_id: str) -> None:
        """Detach the volume if (still) attached to that sandbox."""
        with self._tx() as db:
            db.execute("UPDATE volumes SET attached_to = '' WHERE id = ? AND attached_to = ?",
                       (volume_id, sandbox_id))

    def get_volume(self, volume_id: str) -> VolumeRow | None:
        with self._lock:
            cur = self._db.execute("SELECT id, size_mb, created_at, attached_to FROM volumes "
                                   "WHERE id = ?", (volume_id,))
            found = cur.fetchone()
        return VolumeRow(*found) if found else None

    def list_volumes(self) -> list[VolumeRow]:
        with self._lock:
            cur = self._db.execute("SELECT id, size_mb, created_at, attached_to FROM volumes")
            return [VolumeRow(*r) for r in cur.fetchall()]

    def delete_volume(self, volume_id: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM volumes WHERE id = ?", (volume_id,))
