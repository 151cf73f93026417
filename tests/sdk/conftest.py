"""Runs every SDK test twice: on the embedded engine, and through a real gateway
(``python -m agent_sandbox.server serve`` on loopback) with the remote provider.

The provider is chosen by ``default_provider()`` from the environment, so the tests
themselves do not change: only ``ABX_SANDBOX_BASE_URL`` / ``ABX_SANDBOX_API_KEY`` do.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_sandbox.server.keys import KeyStore
from agent_sandbox.server.process import GatewayProcess


@pytest.fixture(scope="session")
def gateway() -> Iterator[tuple[str, str]]:
    """One gateway for the session and an API key of its own (quota room for the suite)."""
    _, token = KeyStore().create("sdk-tests", max_sandboxes=20, max_commands=64)
    proc = GatewayProcess().start()
    try:
        yield proc.url, token
    finally:
        proc.stop()


@pytest.fixture(params=["local", "remote"], autouse=True)
def provider_kind(request: pytest.FixtureRequest,
                  monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "remote":
        url, token = request.getfixturevalue("gateway")
        monkeypatch.setenv("ABX_SANDBOX_BASE_URL", url)
        monkeypatch.setenv("ABX_SANDBOX_API_KEY", token)
    else:
        monkeypatch.delenv("ABX_SANDBOX_BASE_URL", raising=False)
    return request.param
