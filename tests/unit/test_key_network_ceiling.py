"""A key's network ceiling in the key store: kept with the key, read back as a policy, and
a key file from before ceilings gains the column with its keys left at the gateway's."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.network import parse
from agent_sandbox.surfaces.http.keys import KeyStore

OLD_SCHEMA = """
CREATE TABLE keys (id TEXT PRIMARY KEY, name TEXT NOT NULL, hash TEXT NOT NULL UNIQUE,
    admin INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, revoked_at REAL,
    max_sandboxes INTEGER NOT NULL, max_commands INTEGER NOT NULL);
INSERT INTO keys VALUES ('key-000000000001', 'old', 'h', 0, 1.0, NULL, 5, 5);
"""


def test_ceiling_round_trip(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.db")
    key, token = store.create("ci", network_ceiling="registries, pypi.org")
    assert key.network_ceiling == parse("registries,pypi.org")
    for found in (store.get("ci"), store.authenticate(token), store.list()[0]):
        assert found is not None and found.network_ceiling == key.network_ceiling
    assert key.public()["network_ceiling"] == {"mode": "allowlist", "deny_out": [],
                                               "allow_out": ["registries", "pypi.org"]}
    plain, _ = store.create("plain")
    assert plain.network_ceiling is None and plain.public()["network_ceiling"] is None
    assert store.get("plain").network_ceiling is None
    off, _ = store.create("none", network_ceiling=False)
    assert store.get(off.id).network_ceiling == parse("off")


def test_bad_ceiling_is_refused_and_makes_no_key(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.db")
    with pytest.raises(InvalidArgumentError, match="not understood"):
        store.create("ci", network_ceiling="pypi.org:443")
    assert store.list() == []


def test_old_key_file_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SCHEMA)
    store = KeyStore(path)
    assert store.get("old").network_ceiling is None  # the gateway's ceiling applies
    KeyStore(path)  # a second open finds the column there
    key, _ = store.create("new", network_ceiling="off")
    assert store.get(key.id).network_ceiling == parse("off")


def test_an_unreadable_stored_ceiling_is_the_narrowest(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.db")
    key, _ = store.create("ci", network_ceiling="full")
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE keys SET network_ceiling = ? WHERE id = ?", ("{not json", key.id))
    assert store.get(key.id).network_ceiling == parse("off")
