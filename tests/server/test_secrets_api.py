"""Secrets through the gateway (memory backend: the gateway's checks, mapping, errors and
tenancy): the SDK's Secret, REST /v1/secrets and the CLI. A value goes in and never comes
out; a key's secrets are its own, to list, delete and give its sandboxes."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
from _gw import Gateway

from agent_sandbox import Secret
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError

pytestmark = [pytest.mark.integration, pytest.mark.quick]
VALUE = "tok_0123456789abcdefSECRET"
ABX = [sys.executable, "-m", "agent_sandbox.surfaces.cli"]


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    return gw_memory


def _abx(gw: Gateway, who: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABX_SANDBOX_")}
    env.update(ABX_SANDBOX_BASE_URL=gw.url, ABX_SANDBOX_API_KEY=gw.tokens[who],
               HOME=tempfile.mkdtemp(prefix="abx-home-"), COLUMNS="200")
    return subprocess.run([*ABX, *args], env=env, capture_output=True, text=True,
                          timeout=120, input=stdin)


def test_a_value_goes_in_and_never_comes_out(gw: Gateway) -> None:
    a, b = gw.provider("a"), gw.provider("b")
    info = Secret.create("gh", hosts=["api.example.com"], value=VALUE, env="GH_TOKEN",
                         replace=True, provider=a)
    assert info.header == "Authorization" and info.format == "Bearer {}"
    assert VALUE not in info.model_dump_json()
    with gw.http("a") as http:
        listed = http.get("/v1/secrets")
        assert listed.status_code == 200 and VALUE not in listed.text
        assert [s["name"] for s in listed.json()] == ["gh"]
        # Bad rules are refused with what to give instead.
        bad = http.post("/v1/secrets", json={"name": "x", "hosts": ["https://a.com/"],
                                             "value": "value-123"})
        assert bad.status_code == 400 and "is not a host name" in bad.text
        bad = http.post("/v1/secrets", json={"name": "x", "hosts": ["a.com"],
                                             "value": "value-123\r\nX: y"})
        assert bad.status_code == 400 and "control characters" in bad.text
        # Only printable ASCII: a header's bytes, with no encodings an echo could hide in.
        bad = http.post("/v1/secrets", json={"name": "x", "hosts": ["a.com"],
                                             "value": "valu\u00e9-123"})
        assert bad.status_code == 400 and "printable ASCII" in bad.text
        bad = http.post("/v1/secrets", json={"name": "x", "hosts": ["a.com"],
                                             "value": "value-123",
                                             "header": "Host"})
        assert bad.status_code == 400 and "cannot carry a secret" in bad.text
        dup = http.post("/v1/secrets", json={"name": "gh", "hosts": ["a.com"],
                                             "value": "value-123"})
        assert dup.status_code == 409 and "exists" in dup.text
        assert http.delete("/v1/secrets/..%2F..%2Fkeys").status_code in (400, 404)
    # Another key sees none of them, cannot delete them, and cannot give them to a sandbox.
    assert Secret.list(provider=b) == []
    with pytest.raises(NotFoundError):
        Secret.delete("gh", provider=b)
    with pytest.raises(NotFoundError):
        b.create(secrets=["gh"], network="api.example.com")
    assert [s.name for s in Secret.list(provider=a)] == ["gh"]


def test_a_sandbox_gets_only_secrets_its_policy_can_send(gw: Gateway) -> None:
    a = gw.provider("a")
    Secret.create("api", hosts=["api.example.com:8443"], value=VALUE, query="key",
                  replace=True, provider=a)
    with pytest.raises(InvalidArgumentError, match="network policy"):
        a.create(secrets=["api"])
    with pytest.raises(InvalidArgumentError, match="api.example.com:8443, which network"):
        a.create(secrets=["api"], network="pypi.org")
    with pytest.raises(InvalidArgumentError, match="secret name"):
        a.create(secrets=["../x"], network="api.example.com")
    info = a.create(secrets=["api"], network="api.example.com")
    a.kill(info.sandbox_id, delete_volume=True)


def test_the_cli_reads_the_value_from_stdin_and_never_prints_it(gw: Gateway) -> None:
    made = _abx(gw, "b", "secrets", "create", "npm", "--value-file", "-", "--host",
                "registry.npmjs.org", "--header", "X-Token", "--json", stdin=VALUE + "\n")
    assert made.returncode == 0, made.stderr
    assert VALUE not in made.stdout and '"format": "{}"' in made.stdout
    created = _abx(gw, "b", "sandbox", "create", "--secrets", "npm", "--network",
                   "registry.npmjs.org", "--json")
    assert created.returncode == 0, created.stderr
    b = gw.provider("b")
    assert [s.name for s in Secret.list(provider=b)] == ["npm"]
    Secret.delete("npm", provider=b)
