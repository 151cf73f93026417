"""The state database's schema version: old databases upgraded intact, newer ones refused.

Pure SQLite, no engine: runs without root.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from agent_sandbox.backends.runc.store import SCHEMA_VERSION, Store, VolumeRow
from agent_sandbox.core.errors import RuntimeUnavailableError
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import SandboxState
from agent_sandbox.service.record import SandboxRecord

# What a version-0 database looks like: the schema as written before versioning (commit
# 936c3a8, store._SCHEMA), with no user_version. Never change this fixture.
VERSION_0_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
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
);
CREATE TABLE IF NOT EXISTS volumes (
    id TEXT PRIMARY KEY,
    size_mb INTEGER NOT NULL,
    created_at REAL NOT NULL,
    attached_to TEXT NOT NULL DEFAULT ''
);
"""

LIMITS = {"memory_mb": 1024, "cpu": 1.0, "pids": 512, "disk_mb": 1024}
LAYERS = [{"target": "/", "lowers": ["base"]}]
# One row in every state an old engine could have left, as it wrote them.
OLD_SANDBOXES = [
    ("sbx-running000", "running", 1, 0, "alice", {"A": "1"}, {"k": "v"}, 0),
    ("sbx-paused0000", "paused", 0, 1, "", {}, {}, 0),
    ("sbx-pooled0000", "pooled", 0, 0, "", {}, {}, 0),
    ("sbx-creating00", "creating", 0, 0, "", {}, {}, 4242),
    ("sbx-killing000", "killing", 1, 0, "bob", {}, {}, 0),
    ("sbx-killingvol", "killing-volume", 0, 0, "", {}, {}, 0),
]
OLD_VOLUMES = [("vol-running000", 1024, 10.0, "sbx-running000"), ("vol-kept000000", 64, 11.0, "")]


def _version_0_db(path: Path) -> None:
    db = sqlite3.connect(path)
    db.executescript(VERSION_0_SCHEMA)
    for n, (sid, state, persistent, network, owner, envs, meta, helper) in \
            enumerate(OLD_SANDBOXES):
        db.execute("INSERT INTO sandboxes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                   (sid, "base", state, 100.0 + n, 200.0 + n, 300.0, persistent, network,
                    owner, f"vol-{sid[4:]}", json.dumps(envs), json.dumps(meta),
                    json.dumps(LIMITS), json.dumps(LAYERS), helper))
    db.executemany("INSERT INTO volumes VALUES (?,?,?,?)", OLD_VOLUMES)
    db.commit()
    db.close()


def _user_version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def test_a_version_0_database_is_upgraded_with_every_row(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _version_0_db(path)
    assert _user_version(path) == 0

    store = Store(path)

    assert _user_version(path) == SCHEMA_VERSION
    rows = store.list_sandboxes()
    assert [r.id for r in rows] == [s[0] for s in OLD_SANDBOXES]
    for row, (sid, state, persistent, network, owner, envs, meta, helper) in \
            zip(rows, OLD_SANDBOXES, strict=True):
        assert row == SandboxRecord(
            id=sid, template="base", state=SandboxState(state), created_at=row.created_at,
            last_used=row.last_used, timeout=300.0, persistent=bool(persistent),
            network=NetworkPolicy(mode="full" if network else "off"),  # 0/1 before policies
            volume_id=f"vol-{sid[4:]}", envs=envs, metadata=meta,
            limits=LIMITS, layers=LAYERS, owner=owner, helper_pid=helper)
    assert sorted(store.list_volumes(), key=lambda v: v.id) == \
        sorted((VolumeRow(*v) for v in OLD_VOLUMES), key=lambda v: v.id)
    # Opening again is a no-op; the upgraded database works as before.
    assert len(Store(path).list_sandboxes()) == len(OLD_SANDBOXES)
    assert store.claim_pooled("base", LIMITS, owner="carol") == "sbx-pooled0000"


def test_states_are_the_strings_the_database_always_held(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.insert_sandbox(SandboxRecord("sbx-a", "base", SandboxState.CREATING, 1.0, 1.0, 5.0,
                                    False, NetworkPolicy(), "vol-a"))
    store.update_sandbox("sbx-a", state=SandboxState.KILLING_VOLUME)
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("SELECT state FROM sandboxes").fetchone()[0] == "killing-volume"
    db.close()
    row = store.get_sandbox("sbx-a")
    assert row is not None and row.state is SandboxState.KILLING_VOLUME
    assert row.state == "killing-volume" and json.dumps(row.state) == '"killing-volume"'


def test_a_new_database_starts_at_the_current_version(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    Store(path)
    assert _user_version(path) == SCHEMA_VERSION
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_newer_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _version_0_db(path)
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.execute("CREATE TABLE future (x)")
    db.commit()
    db.close()
    before = path.read_bytes()

    with pytest.raises(RuntimeUnavailableError, match="newer agent-sandbox") as err:
        Store(path)

    assert f"schema version {SCHEMA_VERSION + 1}" in str(err.value)
    assert path.read_bytes() == before
    assert _user_version(path) == SCHEMA_VERSION + 1


def test_a_failed_migration_leaves_the_database_as_it_was(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    from agent_sandbox.backends.runc import store as store_module

    path = tmp_path / "state.db"
    _version_0_db(path)
    broken = (*store_module.MIGRATIONS,
              ("ALTER TABLE sandboxes ADD COLUMN note TEXT NOT NULL DEFAULT ''",
               "THIS IS NOT SQL"))
    monkeypatch.setattr(store_module, "MIGRATIONS", broken)
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", len(broken))

    with pytest.raises(sqlite3.OperationalError):
        Store(path)

    assert _user_version(path) == 0  # not even step 1 is on record: all or nothing
    db = sqlite3.connect(path)
    columns = [r[1] for r in db.execute("PRAGMA table_info(sandboxes)")]
    db.close()
    assert "note" not in columns
    monkeypatch.undo()
    assert len(Store(path).list_sandboxes()) == len(OLD_SANDBOXES)
