"""A gateway subprocess with its own key file: keys A and B (tenants) and an admin key."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _gw import Gateway

from agent_sandbox.server.keys import KeyStore
from agent_sandbox.server.process import GatewayProcess


@pytest.fixture(scope="session")
def gw() -> Iterator[Gateway]:
    keys_file = Path(tempfile.mkdtemp(prefix="abx-gw-keys-")) / "keys.db"
    keys = KeyStore(keys_file)
    gateway = Gateway(GatewayProcess(keys_file=str(keys_file)), keys)
    for name, admin, boxes, cmds in (("a", False, 3, 2), ("b", False, 3, 2),
                                     ("admin", True, 10, 10)):
        _, gateway.tokens[name] = keys.create(name, admin=admin, max_sandboxes=boxes,
                                              max_commands=cmds)
    gateway.proc.start()
    try:
        yield gateway
    finally:
        gateway.proc.stop()


@pytest.fixture
def sandbox_a(gw: Gateway) -> Iterator[str]:
    """A sandbox owned by key A."""
    provider = gw.provider("a")
    info = provider.create()
    yield info.sandbox_id
    try:
        provider.kill(info.sandbox_id, delete_volume=True)
    except Exception:  # noqa: BLE001 - the test may have killed it
        pass
