"""A gateway subprocess with its own key file: keys A and B (tenants) and an admin key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _gw import Gateway
from gateways import running_gateway


@pytest.fixture(scope="session")
def gw() -> Iterator[Gateway]:
    tenant = {"max_sandboxes": 3, "max_commands": 2}
    keys = {"a": tenant, "b": tenant,
            "admin": {"admin": True, "max_sandboxes": 10, "max_commands": 10}}
    with running_gateway("abx-gw-keys-", keys) as (proc, store, tokens):
        yield Gateway(proc, store, tokens)


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
