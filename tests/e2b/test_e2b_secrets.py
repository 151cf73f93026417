"""E2B's shape for secrets, with E2B's own SDK against a real gateway: ``network.rules``
header transforms whose values are ``${e2b.secrets.NAME}`` (``Secret.fill``) give the
sandbox that stored secret, set by its proxy on every request to the host (a real TLS
server on loopback standing in for the internet); the value never enters the sandbox.
What the gateway cannot honour (a literal header value, an unknown secret, a secret whose
rule says otherwise, workload identity) is refused by name, and nothing is made."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from e2bgateway import E2BGateway
from netprobe import SECRET_NAME, secret_hosts

pytestmark = pytest.mark.integration

VALUE = "sk_E2bShapeSecret_0123456789abcdef"
_PROBE = r"""
import http.client, json, ssl, sys
out = []
for port, path, headers in json.loads(sys.stdin.readline()):
    ctx = ssl.create_default_context(cafile=None if port == PORT else "/tmp/upstream-ca.pem")
    c = http.client.HTTPSConnection("api.secret.test", port, timeout=10, context=ctx)
    c.request("GET", path, headers=headers)
    r = c.getresponse()
    out.append([r.status, r.getheader("X-Echo"), r.read().decode(errors="replace")])
print(json.dumps(out))
"""


def _transform(header: str, value: str, host: str = SECRET_NAME) -> dict[str, Any]:
    return {"allow_out": [SECRET_NAME],
            "rules": {host: [{"transform": {"headers": {header: value}}}]}}


@pytest.fixture(scope="module")
def world(e2b_gateway: E2BGateway, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("e2b-secrets")
    with secret_hosts(tmp, 2) as (ports, seen, ca_pem), httpx.Client(
            base_url=e2b_gateway.url, timeout=60,
            headers={"Authorization": f"Bearer {e2b_gateway.keys['a']}"}) as http:
        for name, inject in (("e2bgh", True), ("plain", False)):
            http.delete(f"/v1/secrets/{name}")
            made = http.post("/v1/secrets", json={
                "name": name, "hosts": [f"{SECRET_NAME}:{ports[0]}"], "value": VALUE,
                "inject": inject})
            assert made.status_code == 201, made.text
        yield {"port": ports[0], "other_port": ports[1], "seen": seen, "ca": ca_pem}


def test_a_transform_naming_a_secret_sets_the_header(e2b_env: E2BGateway,
                                                      world: dict[str, Any]) -> None:
    from e2b import Sandbox, Secret

    sb = Sandbox.create(network=_transform("Authorization",
                                           f"Bearer {Secret.fill('e2bgh')}"))
    try:
        sb.files.write("/tmp/probe.py", _PROBE.replace("PORT", str(world["port"])))
        sb.files.write("/tmp/upstream-ca.pem", world["ca"])
        port, other = world["port"], world["other_port"]
        calls = [[port, "/none", {}], [port, "/own", {"Authorization": "Bearer mine"}],
                 [other, "/other-port", {}]]
        sb.files.write("/tmp/calls.json", json.dumps(calls) + "\n")
        res = sb.commands.run("python3 /tmp/probe.py < /tmp/calls.json", timeout=60)
        assert res.exit_code == 0, res.stderr
        env = sb.commands.run("env").stdout
    finally:
        sb.kill()
    assert VALUE not in res.stdout and VALUE not in env
    blank = "*" * len(f"Bearer {VALUE}")
    *mine, elsewhere = json.loads(res.stdout.strip().splitlines()[-1])
    for status, echo, _ in mine:
        assert status == 200 and echo == blank, (status, echo)
    got = {s["path"]: s["headers"] for s in world["seen"]}
    # Set on every request to the host: with none of its own, and over one it sent.
    assert got["/none"]["Authorization"] == f"Bearer {VALUE}"
    assert got["/own"]["Authorization"] == f"Bearer {VALUE}"
    # Another port of the host is not the secret's (its stored rule names the port).
    assert elsewhere[0] == 200 and "Authorization" not in got["/other-port"], elsewhere


@pytest.mark.parametrize(("network", "said"), [
    (_transform("Authorization", "Bearer sk-literal-0123456789"), "names no stored secret"),
    (_transform("Authorization", "Bearer ${e2b.secrets.nosuch}"), "no secret named nosuch"),
    (_transform("Authorization", "Bearer ${e2b.secrets.plain}"), "--inject"),
    (_transform("X-Api-Key", "${e2b.secrets.e2bgh}"), "not as header X-Api-Key"),
    (_transform("Authorization", "Bearer ${e2b.secrets.e2bgh}", "other.test"),
     "not to other.test"),
    (_transform("Authorization", "Bearer ${e2b.identity.tokens.aws}"), "workload identity"),
])
def test_what_cannot_be_honoured_is_refused_by_name(e2b_env: E2BGateway,
                                                     world: dict[str, Any],
                                                     network: dict[str, Any],
                                                     said: str) -> None:
    from e2b import Sandbox
    from e2b.exceptions import InvalidArgumentException, NotFoundException, SandboxException

    before = len(Sandbox.list().next_items())
    with pytest.raises((InvalidArgumentException, NotFoundException, SandboxException)) as got:
        Sandbox.create(network=network)
    assert said in str(got.value), str(got.value)
    assert len(Sandbox.list().next_items()) == before  # nothing was made


def test_iam_tokens_are_refused_by_name(e2b_env: E2BGateway) -> None:
    from e2b import Sandbox, Secret
    from e2b.exceptions import InvalidArgumentException, SandboxException

    with pytest.raises((InvalidArgumentException, SandboxException)) as got:
        Sandbox.create(iam={"tokens": {"aws": Secret.iam_token(audience="sts.amazonaws.com",
                                                              token_type="JWT-SVID")}})
    assert "iam" in str(got.value) and "not supported" in str(got.value)

