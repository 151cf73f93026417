"""A gateway subprocess with its own key file: keys A and B (tenants) and an admin key;
on the embedded engine (``gw``), or on the memory backend (``gw_memory``: a module whose
subject is the gateway itself, its checks, mapping, errors and tenancy, overrides ``gw``
with it, and is in the quick tier)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _gw import Gateway
from gateways import running_gateway

TENANT = {"max_sandboxes": 3, "max_commands": 2}
KEYS = {"a": TENANT, "b": TENANT,
        "admin": {"admin": True, "max_sandboxes": 10, "max_commands": 10}}


@pytest.fixture(scope="session")
def gw() -> Iterator[Gateway]:
    with running_gateway("abx-gw-keys-", KEYS) as (proc, store, tokens):
        yield Gateway(proc, store, tokens)


@pytest.fixture(scope="session")
def gw_memory() -> Iterator[Gateway]:
    with running_gateway("abx-gw-mem-", KEYS, env={"ABX_ENGINE": "memory"}) as (
            proc, store, tokens):
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
