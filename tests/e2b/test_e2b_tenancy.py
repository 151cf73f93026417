"""A second key can neither see nor touch the first key's sandbox through any E2B endpoint:
the control plane answers 404 as for a sandbox that does not exist, and every request
addressed to the sandbox (envd, the code interpreter, its ports) needs that sandbox's own
access token, which only its owner's key is given."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2 as httpx
import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration


@pytest.fixture
def a_sandbox(e2b_env: E2BGateway) -> Iterator[object]:
    from e2b import Sandbox

    sb = Sandbox.create()
    yield sb
    sb.kill()


def test_key_b_cannot_see_or_touch_key_a_sandbox(e2b_gateway: E2BGateway,
                                                 a_sandbox: object) -> None:
    from e2b import Sandbox
    from e2b.exceptions import NotFoundException, SandboxException

    victim = a_sandbox.sandbox_id  # type: ignore[attr-defined]
    b = {"api_key": e2b_gateway.keys["b"], "api_url": e2b_gateway.url,
         "sandbox_url": e2b_gateway.url}
    assert victim not in [s.sandbox_id for s in Sandbox.list(**b).next_items()]
    with pytest.raises((NotFoundException, SandboxException)):
        Sandbox.get_info(victim, **b)
    with pytest.raises((NotFoundException, SandboxException)):
        Sandbox.connect(victim, **b)
    with pytest.raises((NotFoundException, SandboxException)):
        Sandbox.set_timeout(victim, 60, **b)
    with pytest.raises((NotFoundException, SandboxException)):
        Sandbox.pause(victim, **b)
    with pytest.raises((NotFoundException, SandboxException)):
        Sandbox.update_network(victim, {"allow_internet_access": True}, **b)
    assert Sandbox.kill(victim, **b) is False
    # Every refusal above left it alone.
    assert a_sandbox.is_running()  # type: ignore[attr-defined]
    assert a_sandbox.get_info().state.value == "running"  # type: ignore[attr-defined]


def _addressed(url: str, sandbox_id: str, port: int, token: str | None,
               path: str = "/health", **kw: object) -> httpx.Response:
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(port)}
    if token is not None:
        headers["X-Access-Token"] = token
    return httpx.post(url + path, headers=headers, timeout=30, **kw) if path != "/health" \
        else httpx.get(url + path, headers=headers, timeout=30)


def test_sandbox_addressed_requests_need_that_sandboxes_token(
        e2b_gateway: E2BGateway, a_sandbox: object) -> None:
    from e2b import Sandbox

    url = e2b_gateway.url
    victim = a_sandbox.sandbox_id  # type: ignore[attr-defined]
    own = Sandbox.create(api_key=e2b_gateway.keys["b"], api_url=url, sandbox_url=url)
    try:
        b_token = own._envd_access_token
        assert _addressed(url, own.sandbox_id, 49983, b_token).status_code == 204
        for port in (49983, 49999, 8000):
            for token in (None, "", b_token, "x" * 5000):
                reply = _addressed(url, victim, port, token)
                assert reply.status_code == 401, (port, token, reply.text)
                assert "access token" in reply.json()["message"]
        # A Connect call with the wrong token is refused in Connect's own error shape.
        reply = _addressed(url, victim, 49983, b_token, "/process.Process/List",
                           json={}, )
        assert reply.status_code == 401
        assert reply.json()["code"] == "unauthenticated"
        # The domain mode (<port>-<id>.<domain>, behind a reverse proxy) is checked alike.
        reply = httpx.get(url + "/health", headers={"Host": f"49983-{victim}.sbx.example",
                                                    "X-Access-Token": b_token})
        assert reply.status_code == 401
        good = httpx.get(url + "/health", headers={
            "Host": f"49983-{own.sandbox_id}.sbx.example", "X-Access-Token": b_token})
        assert good.status_code == 204
    finally:
        own.kill()


@pytest.mark.parametrize(("sandbox_id", "port", "status"), [
    ("sbx-doesnotexi", "49983", 401), ("../../etc", "49983", 404), ("sbx-" + "a" * 300, "1", 404),
    ("sbx-abcdefghij", "notaport", 400), ("sbx-abcdefghij", "99999", 400),
    ("sbx-abcdefghij", "0", 400)])
def test_malformed_addresses_get_clear_errors(e2b_gateway: E2BGateway, sandbox_id: str,
                                              port: str, status: int) -> None:
    """A well-formed id with a wrong token is a 401 whether it exists or not: its
    existence is not told to whoever lacks its token."""
    reply = httpx.get(e2b_gateway.url + "/health", headers={
        "E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": port, "X-Access-Token": "t"})
    assert reply.status_code == status, reply.text
    assert reply.json()["message"]


def test_quotas_apply_and_are_not_retried(e2b_gateway: E2BGateway) -> None:
    """A key's sandbox quota holds on E2B's create as on the REST API, and its 429 tells
    the SDK not to retry (it would only wait for nothing)."""
    from e2b import Sandbox
    from e2b.exceptions import RateLimitException, SandboxException

    _, token = e2b_gateway.store.create("one-only", e2b=True, max_sandboxes=1)
    opts = {"api_key": token, "api_url": e2b_gateway.url, "sandbox_url": e2b_gateway.url}
    first = Sandbox.create(**opts)
    try:
        with pytest.raises((RateLimitException, SandboxException)) as caught:
            Sandbox.create(**opts)
        assert "1" in str(caught.value) and "sandbox" in str(caught.value).lower()
        reply = httpx.post(e2b_gateway.url + "/v2/sandboxes", json={"templateID": "base"},
                           headers={"X-API-KEY": token})
        assert reply.status_code == 429 and reply.headers["should-retry"] == "false"
    finally:
        first.kill()
