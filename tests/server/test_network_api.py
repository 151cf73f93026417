"""Network policies through the REST gateway: every shape create takes, PUT .../network,
and the ceilings no request can exceed: the gateway's (ABX_GATEWAY_NETWORK_CEILING) and each
API key's own (`abx keys create --network`), on create and on set_network alike."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _gw import Gateway

from agent_sandbox.core.errors import InvalidArgumentError, PermissionDeniedError
from agent_sandbox.core.network import parse
from agent_sandbox.remote import RemoteProvider
from agent_sandbox.surfaces.gateway.process import GatewayProcess
from agent_sandbox.surfaces.http.keys import KeyStore

pytestmark = [pytest.mark.integration, pytest.mark.quick]


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    """This module's subject is the gateway itself: on the memory backend."""
    return gw_memory

UNUSED_ID = "sbx-0000000000"  # an admin key reaches the ceiling check without a sandbox


@pytest.fixture(scope="module")
def limited(gw: Gateway) -> dict[str, str]:
    """Keys whose ceiling is `registries`: a tenant, and an admin (ceilings bind admins too)."""
    tokens = {}
    for name, admin in (("reg", False), ("reg-admin", True)):
        key, tokens[name] = gw.keys.create(name, admin=admin, max_sandboxes=3,
                                           network_ceiling="registries")
        assert key.network_ceiling == parse("registries")
    return tokens


def http(gw: Gateway, token: str):  # noqa: ANN201 - an httpx client
    import httpx2 as httpx

    return httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {token}"},
                        timeout=60)


def assert_key_ceiling(response, name: str) -> None:  # noqa: ANN001
    assert response.status_code == 403, response.text
    body = response.json()
    assert body["code"] == "permission_denied"
    assert f"API key '{name}'" in body["message"], body
    assert "the network ceiling is allowlist (registries)" in body["message"], body
    assert "abx keys create --network" in body["message"], body
    assert body["details"]["ceiling"] == {"mode": "allowlist", "allow_out": ["registries"],
                                          "deny_out": []}


@pytest.mark.parametrize("network", [True, "full", "on", {"mode": "full"},
                                     {"deny_out": ["evil.example"]}, "pypi.org,github.com",
                                     ["*.ubuntu.com"], "151.101.0.0/16"])
def test_key_ceiling_refuses_more_on_create(gw: Gateway, limited: dict[str, str],
                                            network: object) -> None:
    with http(gw, limited["reg"]) as client:
        r = client.post("/v1/sandboxes", json={"network": network})
        assert_key_ceiling(r, "reg")
        assert client.get("/v1/sandboxes").json() == []  # nothing was made


def test_key_ceiling_refuses_more_on_set_network(gw: Gateway,
                                                 limited: dict[str, str]) -> None:
    with http(gw, limited["reg-admin"]) as client:
        for network in (True, "full", "github.com"):
            r = client.put(f"/v1/sandboxes/{UNUSED_ID}/network", json={"network": network})
            assert_key_ceiling(r, "reg-admin")
        r = client.put(f"/v1/sandboxes/{UNUSED_ID}/network", json={"network": "pypi.org"})
        assert r.status_code == 404  # within the ceiling: on to the sandbox, which is not there


def test_remote_provider_raises_the_same_error(gw: Gateway, limited: dict[str, str]) -> None:
    provider = RemoteProvider(gw.url, limited["reg"], retry_seconds=5)
    with pytest.raises(PermissionDeniedError, match="API key 'reg'"):
        provider.create(network="full")
    admin = RemoteProvider(gw.url, limited["reg-admin"], retry_seconds=5)
    with pytest.raises(PermissionDeniedError, match="registries"):
        admin.set_network(UNUSED_ID, "full")
    # A bad policy never leaves the client: the SDK's own message.
    with pytest.raises(InvalidArgumentError, match="not understood"):
        provider.create(network="pypi.org:443")


@pytest.mark.parametrize(("network", "says"), [
    ("pypi.org:443", "network entry 'pypi.org:443' is not understood"),
    ({"mode": "sometimes"}, "network mode 'sometimes' is not one of"),
    ({"allow_out": ["pypi.org"], "extra": 1}, "unknown field"),
    ({"allow_out": "pypi.org"}, "allow_out and deny_out arrays of strings"),
    (1, "network 1 is not understood"),
    (["x" * 300], "is not understood"),  # shown cut, not whole
    ("x" * 70000, "(70002 characters)"),
    (["a.com"] * 300, "at most 256"),
])
def test_bad_policies_are_400_with_a_clear_message(gw: Gateway, network: object,
                                                   says: str) -> None:
    with gw.http("a") as client:
        r = client.post("/v1/sandboxes", json={"network": network})
        assert r.status_code == 400, r.text
        assert says in r.json()["message"], r.json()
        assert len(r.text) < 4000
        r = client.put(f"/v1/sandboxes/{UNUSED_ID}/network", json={"network": network})
        assert r.status_code in (400, 404), r.text  # a tenant learns nothing of others' ids


def test_openapi_states_every_shape(gw: Gateway) -> None:
    with gw.http("a") as client:
        spec = client.get("/openapi.json").json()
    create = spec["components"]["schemas"]["CreateSpec"]["properties"]["network"]
    kinds = {branch["type"] for branch in create["anyOf"]}
    assert kinds == {"boolean", "string", "array", "object"}
    (body,) = [branch for branch in create["anyOf"] if branch["type"] == "object"]
    assert set(body["properties"]) == {"mode", "allow_out", "deny_out"}
    assert "put" in spec["paths"]["/v1/sandboxes/{sandbox_id}/network"]
    assert "403" in spec["paths"]["/v1/sandboxes/{sandbox_id}/network"]["put"]["responses"]


def test_within_the_key_ceiling_is_accepted(gw: Gateway, limited: dict[str, str]) -> None:
    """Needs the engine's network policies (a networked sandbox is started)."""
    provider = RemoteProvider(gw.url, limited["reg"], retry_seconds=5)
    info = provider.create(network={"allow_out": ["pypi.org", "files.pythonhosted.org"]})
    try:
        assert parse(info.network) == parse("pypi.org,files.pythonhosted.org")
        with http(gw, limited["reg"]) as client:
            got = client.get(f"/v1/sandboxes/{info.sandbox_id}").json()
            assert got["network"] == {"mode": "allowlist", "deny_out": [],
                                      "allow_out": ["pypi.org", "files.pythonhosted.org"]}
            r = client.put(f"/v1/sandboxes/{info.sandbox_id}/network",
                           json={"network": "full"})
            assert_key_ceiling(r, "reg")
            assert client.get(f"/v1/sandboxes/{info.sandbox_id}").json()["network"] == \
                got["network"]  # unchanged
            r = client.put(f"/v1/sandboxes/{info.sandbox_id}/network",
                           json={"network": "registries"})
            assert r.status_code == 200, r.text
            assert r.json()["network"]["allow_out"] == ["registries"]
        provider.set_network(info.sandbox_id, "off")
        assert parse(provider.info(info.sandbox_id).network).mode == "off"
    finally:
        provider.kill(info.sandbox_id, delete_volume=True)


@pytest.fixture(scope="module")
def closed_gateway() -> Iterator[tuple[GatewayProcess, str]]:
    """A gateway whose operator allows no network at all; one admin key without a ceiling
    of its own."""
    keys_file = Path(tempfile.mkdtemp(prefix="abx-gw-net-")) / "keys.db"
    _, token = KeyStore(keys_file).create("root", admin=True)
    proc = GatewayProcess(keys_file=str(keys_file),
                          extra_env={"ABX_GATEWAY_NETWORK_CEILING": "off"}).start()
    try:
        yield proc, token
    finally:
        proc.stop()


def test_gateway_ceiling_binds_every_key(closed_gateway: tuple[GatewayProcess, str]) -> None:
    proc, token = closed_gateway
    provider = RemoteProvider(proc.url, token, retry_seconds=5)
    # The admin key sees the worker's whole data dir: what earlier tests left is not ours.
    before = {i.sandbox_id for i in provider.list()}
    for ask in ("registries", True, "203.0.113.7"):
        with pytest.raises(PermissionDeniedError) as caught:
            provider.create(network=ask)
        message = caught.value.message
        assert "this gateway's operator" in message and "ABX_GATEWAY_NETWORK_CEILING" in message
        assert "the network ceiling is off" in message
        with pytest.raises(PermissionDeniedError, match="ceiling is off"):
            provider.set_network(UNUSED_ID, ask)
    assert {i.sandbox_id for i in provider.list()} <= before  # no refused create made one


def test_keys_cli_stores_and_lists_the_ceiling(tmp_path: Path) -> None:
    path = str(tmp_path / "keys.db")
    cli = [sys.executable, "-m", "agent_sandbox.surfaces.cli", "keys"]
    made = subprocess.run([*cli, "create", "--name", "ci", "--network", "registries, pypi.org",
                           "--api-keys-file", path, "--json"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    listed = subprocess.run([*cli, "list", "--api-keys-file", path, "--json"],
                            capture_output=True, text=True, check=True).stdout
    assert '"allow_out": [\n        "registries",\n        "pypi.org"' in listed
    bad = subprocess.run([*cli, "create", "--name", "x", "--network", "pypi.org:443",
                          "--api-keys-file", path], capture_output=True, text=True)
    assert bad.returncode != 0 and "not understood" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert KeyStore(path).get("ci").network_ceiling == parse("registries,pypi.org")
