"""Secrets at rest are 0600 from birth: the engine's database with its -wal/-shm, the
gateway's key store, and every file under the data dir that holds a sandbox's env value."""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
from pathlib import Path

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.surfaces.http.keys import KeyStore

pytestmark = pytest.mark.integration


def _private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


def _files(root: Path) -> list[Path]:
    """Regular files under root, not descending into mounts (sandbox disks and views)."""
    out = []
    dev = root.stat().st_dev
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(folder, d)).st_dev == dev
                   and not os.path.ismount(os.path.join(folder, d))]
        out += [Path(folder) / f for f in files if os.path.isfile(os.path.join(folder, f))
                and not os.path.islink(os.path.join(folder, f))]
    return out


def _holds(path: Path, secret: bytes) -> bool:
    try:
        return path.stat().st_size < 16 << 20 and secret in path.read_bytes()
    except FileNotFoundError:  # a temporary file the engine renamed meanwhile (/etc's copy)
        return False


def test_engine_state_holding_secrets_is_private() -> None:
    data = Path(os.environ["ABX_DATA_DIR"])
    secret = "abx-secret-" + secrets.token_hex(12)
    with Sandbox.create(envs={"API_TOKEN": secret}) as sb:
        assert sb.commands.run("echo $API_TOKEN").stdout.strip() == secret
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            assert _private(data / name), (name, oct((data / name).stat().st_mode))
        # Disk images (sparse, gigabytes) hold the sandbox's own files, not host state.
        holders = [p for p in _files(data) if _holds(p, secret.encode())]
        assert holders, "the secret is somewhere in the engine's state"
        for path in holders:
            assert _private(path), (path, oct(path.stat().st_mode))
    assert stat.S_IMODE(data.stat().st_mode) & 0o007 == 0
    assert stat.S_IMODE((data / "templates").stat().st_mode) == 0o700


def test_an_old_world_readable_wal_is_narrowed() -> None:
    folder = Path(tempfile.mkdtemp(prefix="abx-keys-"))
    try:
        for name in ("keys.db", "keys.db-wal", "keys.db-shm"):
            (folder / name).touch(mode=0o644)
            os.chmod(folder / name, 0o644)
        (folder / "keys.db").unlink()  # a fresh database beside stale companions
        store = KeyStore(folder / "keys.db")
        store.create("dev")
        for name in ("keys.db", "keys.db-wal", "keys.db-shm"):
            assert _private(folder / name), name
    finally:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
