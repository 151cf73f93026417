"""A real gateway (``abx serve`` as a subprocess) with two E2B-shaped keys, and E2B's own
SDKs (the PyPI packages, unmodified) pointed at it by environment variables only, the way
docs/e2b.md tells a user to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2bgateway import E2BGateway
from gateways import running_gateway

pytestmark = pytest.mark.integration
# E2B's own tests, vendored: not our suite (scripts/e2b_suites.py runs them).
collect_ignore = ["upstream"]


@pytest.fixture(scope="session")
def e2b_gateway() -> Iterator[E2BGateway]:
    pytest.importorskip("e2b", reason="the e2b SDK is not installed (pip install -e .[test])")
    tenant = {"e2b": True, "max_sandboxes": 20, "max_commands": 32}
    with running_gateway("abx-e2b-keys-", {"a": tenant, "b": tenant}) as (proc, store, keys):
        yield E2BGateway(proc, store, keys)


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


@pytest.fixture(scope="module")
def gateway_env(e2b_gateway: E2BGateway) -> Iterator[E2BGateway]:
    """The SDKs pointed at the gateway as key A, for a whole test module."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in e2b_gateway.env("a").items():
            mp.setenv(name, value)
        yield e2b_gateway


@pytest.fixture(scope="module")
def ci(gateway_env: E2BGateway, code_template: str) -> Iterator[object]:
    """``e2b_code_interpreter.Sandbox.create()`` (its default template, code-interpreter-v1)
    as key A, one per test module; the SDK keeps the URLs and key it was created with."""
    from e2b_code_interpreter import Sandbox

    sb = Sandbox.create(timeout=600)
    try:
        yield sb
    finally:
        sb.kill()
