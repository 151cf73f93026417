"""A real gateway (``abx serve`` as a subprocess) with two E2B-shaped keys, and E2B's own
SDKs (the PyPI packages, unmodified) pointed at it by environment variables only, the way
docs/e2b.md tells a user to."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2bgateway import E2BGateway

from agent_sandbox.server.keys import KeyStore
from agent_sandbox.server.process import GatewayProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def e2b_gateway() -> Iterator[E2BGateway]:
    pytest.importorskip("e2b", reason="the e2b SDK is not installed (pip install -e .[test])")
    keys_file = Path(tempfile.mkdtemp(prefix="abx-e2b-keys-")) / "keys.db"
    store = KeyStore(keys_file)
    gateway = E2BGateway(GatewayProcess(keys_file=str(keys_file)), store)
    for name in ("a", "b"):
        _, gateway.keys[name] = store.create(name, e2b=True, max_sandboxes=20,
                                             max_commands=32)
    gateway.proc.start()
    try:
        yield gateway
    finally:
        gateway.proc.stop()


@pytest.fixture
def e2b_env(e2b_gateway: E2BGateway, monkeypatch: pytest.MonkeyPatch) -> E2BGateway:
    """The SDKs in this process pointed at the gateway as key A."""
    for name, value in e2b_gateway.env("a").items():
        monkeypatch.setenv(name, value)
    return e2b_gateway


@pytest.fixture
def e2b_sandbox(e2b_env: E2BGateway) -> Iterator[object]:
    """``e2b.Sandbox.create()`` (template ``base``), killed afterwards."""
    from e2b import Sandbox

    sb = Sandbox.create()
    yield sb
    try:
        sb.kill()
    except Exception:  # noqa: BLE001 - the test may have killed it
        pass
