"""The host's secret store and a sandbox's secret material: 0600 from birth, per owner,
values only where the proxy needs them, a CA limited to the secrets' hosts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError
from agent_sandbox.core.secrets import SecretRule
from agent_sandbox.service.secrets import SANDBOX_CA_PATH, SecretStore

VALUE = "s3cr3t-value-for-tests"


def test_stored_0600_per_owner_and_listed_without_value(tmp_path: Path) -> None:
    store = SecretStore.of(tmp_path)
    old = os.umask(0)  # a careless umask changes nothing
    try:
        store.put("key-a", SecretRule(name="gh", hosts=["api.github.com"]), VALUE)
    finally:
        os.umask(old)
    files = list((tmp_path / "secrets").rglob("*.json"))
    assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600
    assert files[0].parent.stat().st_mode & 0o777 == 0o700
    assert VALUE not in json.dumps([s.model_dump() for s in store.list("key-a")])
    assert store.list("key-b") == []
    with pytest.raises(NotFoundError):
        store.resolve("key-b", ["gh"])
    with pytest.raises(InvalidArgumentError):
        store.get("key-a", "../gh")
    [(rule, value)] = store.resolve("key-a", ["gh"])
    assert value == VALUE and rule.env == "GH_TOKEN" and rule.format == "Bearer {}"


def test_rules_are_checked() -> None:
    assert SecretRule(name="b", hosts="a.com", basic=True).format == "Basic {}"
    assert SecretRule(name="h", hosts=["a.com"], header="X-Key").format == "{}"
    assert SecretRule(name="q", hosts=["a.com:8443"], query="k").header is None
    for bad in ({"hosts": []}, {"hosts": ["*.a.com"]}, {"hosts": ["1.2.3.4:0"]},
                {"hosts": ["a.com"], "header": "Content-Length"},
                {"hosts": ["a.com"], "format": "Bearer"},
                {"hosts": ["a.com"], "format": "{} {}"}, {"hosts": ["a.com"], "env": "1X"},
                # Not strings where strings go (a JSON body's true or 5): refused, no crash.
                {"hosts": [True]}, {"hosts": 7}, {"hosts": ["a.com"], "header": True},
                {"hosts": ["a.com"], "query": True}, {"hosts": ["a.com"], "env": 5}):
        with pytest.raises(InvalidArgumentError):
            SecretRule(name="x", **bad)


def test_material_has_a_ca_only_for_the_secret_hosts(tmp_path: Path) -> None:
    from cryptography import x509

    store = SecretStore.of(tmp_path)
    store.prepare("sbx-abc", [(SecretRule(name="gh", hosts=["api.github.com"]), VALUE)])
    material = store.material("sbx-abc")
    assert material is not None and set(material.leaves) == {"api.github.com"}
    assert material.envs()["GH_TOKEN"] == "abx-secret:gh"
    assert material.envs()["SSL_CERT_FILE"] == SANDBOX_CA_PATH
    proxy_file = tmp_path / "secrets" / "sandboxes" / "sbx-abc.json"
    assert proxy_file.stat().st_mode & 0o777 == 0o600
    bundle = Path(material.ca_bundle)
    assert bundle.stat().st_mode & 0o777 == 0o644
    assert VALUE.encode() not in bundle.read_bytes() and b"PRIVATE KEY" not in bundle.read_bytes()
    begin = b"-----BEGIN CERTIFICATE-----"
    last = begin + bundle.read_bytes().split(begin)[-1]
    ca = x509.load_pem_x509_certificate(last)  # ours comes after the host's
    limits = ca.extensions.get_extension_for_class(x509.NameConstraints).value
    assert [n.value for n in limits.permitted_subtrees] == ["api.github.com"]
    store.forget("sbx-abc")
    assert store.material("sbx-abc") is None and not bundle.exists()


def test_a_secret_host_is_a_name_never_an_address() -> None:
    for given in ("1.2.3.4", "127.1", "2130706433", "0x7f.1:443", "*.example.com",
                  "https://a.com/"):
        with pytest.raises(InvalidArgumentError, match="is not a host name"):
            SecretRule(name="x", hosts=[given])
    assert SecretRule(name="x", hosts=["API.Example.com.", "3com.example:8443"]).hosts == (
        "api.example.com", "3com.example:8443")


def test_an_inject_rule_and_what_an_e2b_transform_may_name() -> None:
    rule = SecretRule(name="gh", hosts=["api.github.com", "git.example.com:8443"],
                      inject=True)
    assert "on every request" in rule.describe()
    with pytest.raises(InvalidArgumentError, match="inject sets a header"):
        SecretRule(name="q", hosts=["a.com"], query="k", inject=True)
    assert rule.header_transform_refused("api.github.com", "authorization", "Bearer {}") == ""
    assert rule.header_transform_refused("git.example.com", "Authorization", "Bearer {}") == ""
    assert "not to evil.com" in rule.header_transform_refused("evil.com", "Authorization",
                                                             "Bearer {}")
    assert "not as header X-Key" in rule.header_transform_refused("api.github.com", "X-Key",
                                                                  "{}")
    assert "not as header" in rule.header_transform_refused("api.github.com",
                                                            "Authorization", "token {}")
    placeholder_only = rule.model_copy(update={"inject": False})
    assert "--inject" in placeholder_only.header_transform_refused(
        "api.github.com", "Authorization", "Bearer {}")


def test_the_proxy_sets_an_inject_header_over_the_sandboxes() -> None:
    from agent_sandbox.backends.runc.netproxy.inject import Secrets, rewrite

    secrets = Secrets([{**SecretRule(name="gh", hosts=["api.github.com"], inject=True)
                        .model_dump(mode="json"), "value": VALUE}], {})
    head = (b"GET /x HTTP/1.1\r\nHost: api.github.com\r\nauthorization: Bearer mine\r\n"
            b"Accept: */*\r\n\r\n")
    sent, why = rewrite(head, "api.github.com", 443, secrets)
    assert why == "" and sent.count(b"uthorization") == 1
    assert f"Authorization: Bearer {VALUE}\r\n".encode() in sent and b"mine" not in sent
    sent, why = rewrite(b"GET /x HTTP/1.1\r\nHost: api.github.com\r\n\r\n", "api.github.com",
                        443, secrets)
    assert f"Authorization: Bearer {VALUE}\r\n".encode() in sent
    # Its placeholder anywhere else is still refused.
    sent, why = rewrite(b"GET /abx-secret:gh HTTP/1.1\r\nHost: api.github.com\r\n\r\n",
                        "api.github.com", 443, secrets)
    assert sent == b"" and "secret gh goes only to" in why
