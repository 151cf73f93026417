"""Runs every SDK test twice: on the embedded engine, and through a real gateway
(``python -m agent_sandbox.surfaces.gateway serve`` on loopback) with the remote provider; the
core modules (K8S_CORE) a third time on the Kubernetes provider, on the test cluster.

The provider is chosen by ``default_provider()`` from the environment, so the tests
themselves do not change: only ``ABX_SANDBOX_BASE_URL`` / ``ABX_SANDBOX_API_KEY`` do.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent_sandbox.surfaces.gateway.process import GatewayProcess
from agent_sandbox.surfaces.http.keys import KeyStore


@pytest.fixture(scope="session")
def gateway() -> Iterator[tuple[str, str]]:
    """One gateway for the session and an API key of its own (quota room for the suite)."""
    _, token = KeyStore().create("sdk-tests", max_sandboxes=20, max_commands=64)
    proc = GatewayProcess().start()
    try:
        yield proc.url, token
    finally:
        proc.stop()


K8S_CORE = ("test_lifecycle", "test_commands", "test_files", "test_volumes", "test_dirs")
# About the embedded engine's own internals (runc state of a long-paused container); the
# Pod equivalent is in tests/kubernetes.
K8S_NOT = ("test_long_paused_sandbox_releases_memory_and_boots_again",)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    kinds = ["local", "remote"]
    if (metafunc.module.__name__.rpartition(".")[2] in K8S_CORE
            and metafunc.function.__name__ not in K8S_NOT):
        kinds.append("kubernetes")
    metafunc.parametrize("provider_kind", kinds, indirect=True)


@pytest.fixture(autouse=True)
def provider_kind(request: pytest.FixtureRequest,
                  monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "kubernetes":
        cluster = request.getfixturevalue("k8s_cluster")
        for name, value in cluster.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("ABX_SANDBOX_BASE_URL", raising=False)
    elif request.param == "remote":
        url, token = request.getfixturevalue("gateway")
        monkeypatch.setenv("ABX_SANDBOX_BASE_URL", url)
        monkeypatch.setenv("ABX_SANDBOX_API_KEY", token)
    else:
        monkeypatch.delenv("ABX_SANDBOX_BASE_URL", raising=False)
    return request.param
