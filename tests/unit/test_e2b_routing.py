"""E2B's sandbox addressing and access tokens, in-process: what the router reads from a
request, and that tokens are per sandbox, per gateway, stable across restarts, and kept in
a 0600 file."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path
from urllib.parse import quote

import pytest

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.surfaces.e2b.routing import addressed, signed_url, username
from agent_sandbox.surfaces.e2b.tokens import SECRET_FILE, AccessTokens, SignedUrl


def _scope(*headers: tuple[str, str]) -> dict[str, object]:
    return {"headers": [(k.encode(), v.encode()) for k, v in headers]}


@pytest.mark.parametrize(("headers", "expected"), [
    ((("E2b-Sandbox-Id", "sbx-abcdefghij"), ("E2b-Sandbox-Port", "49999")),
     ("sbx-abcdefghij", "49999")),
    ((("e2b-sandbox-id", "sbx-abcdefghij"),), ("sbx-abcdefghij", "49983")),
    ((("host", "8080-sbx-abcdefghij.sandboxes.example.com"),), ("sbx-abcdefghij", "8080")),
    ((("host", "8080-SBX-ABCDEFGHIJ.example"),), ("sbx-abcdefghij", "8080")),
    ((("host", "127.0.0.1:8080"),), None),
    ((("host", "sbx-abcdefghij.example"),), None),
    ((("host", "123456-sbx-abcdefghij.example"),), None),
    ((), None),
])
def test_what_a_request_addresses(headers: tuple[tuple[str, str], ...],
                                  expected: tuple[str, str] | None) -> None:
    assert addressed(_scope(*headers)) == expected


@pytest.mark.parametrize(("header", "user"), [
    ("Basic " + base64.b64encode(b"user:").decode(), "user"),
    ("Basic " + base64.b64encode(b"root:").decode(), "root"),
    ("basic " + base64.b64encode(b":").decode(), None),
    ("Basic !!!notbase64", None),
    ("Basic " + base64.b64encode(b"\xff\xfe:").decode(), None),
    ("Bearer abc", None),
])
def test_the_username_the_sdk_sends(header: str, user: str | None) -> None:
    assert username(_scope(("authorization", header))) == user


def test_tokens_are_per_sandbox_per_gateway_and_survive_restarts(tmp_path: Path) -> None:
    tokens = AccessTokens(tmp_path / "gw")
    first = tokens.for_sandbox("sbx-aaaaaaaaaa")
    assert tokens.valid("sbx-aaaaaaaaaa", first)
    assert not tokens.valid("sbx-bbbbbbbbbb", first)
    assert not tokens.valid("sbx-aaaaaaaaaa", None)
    assert not tokens.valid("sbx-aaaaaaaaaa", "")
    assert not tokens.valid("sbx-aaaaaaaaaa", first + "x")
    mode = stat.S_IMODE(os.stat(tmp_path / "gw" / SECRET_FILE).st_mode)
    assert mode == 0o600
    assert AccessTokens(tmp_path / "gw").for_sandbox("sbx-aaaaaaaaaa") == first
    assert AccessTokens(tmp_path / "other").for_sandbox("sbx-aaaaaaaaaa") != first


def test_a_secret_file_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    (tmp_path / SECRET_FILE).write_bytes(b"short")
    with pytest.raises(InvalidArgumentError, match="delete it"):
        AccessTokens(tmp_path).for_sandbox("sbx-aaaaaaaaaa")
    (tmp_path / SECRET_FILE).unlink()
    (tmp_path / SECRET_FILE).symlink_to("/etc/hostname")
    with pytest.raises(OSError):
        AccessTokens(tmp_path).for_sandbox("sbx-aaaaaaaaaa")


def _request(method: str, path: str, query: str) -> dict[str, object]:
    return {"type": "http", "method": method, "path": path,
            "query_string": query.encode(), "headers": []}


def test_a_signed_file_url_is_read_as_envd_reads_it(tmp_path: Path) -> None:
    """E2B's SDK's signature (e2b.sandbox.signature.get_signature) is the one the gateway
    expects; any part changed breaks it; only GET/POST /files carry one."""
    from e2b.sandbox.signature import get_signature

    tokens = AccessTokens(tmp_path)
    token = tokens.for_sandbox("sbx-abcdefghij")
    made = get_signature("a b/ü.txt", "read", "user", token, 60)
    # As the SDK's URL has it (urlencode): a base64 '+' or '/' escaped.
    query = (f"path=a%20b%2F%C3%BC.txt&username=user&signature={quote(made['signature'], safe='')}"
             f"&signature_expiration={made['expiration']}")
    url = signed_url(_request("GET", "/files", query))
    assert url is not None and url.path == "a b/ü.txt" and url.operation == "read"
    assert tokens.signed("sbx-abcdefghij", url)
    assert not tokens.signed("sbx-bbbbbbbbbb", url)  # another sandbox's token
    assert not url.expired(made["expiration"]) and url.expired(made["expiration"] + 1)
    write = signed_url(_request("POST", "/files", query))
    assert write is not None and not tokens.signed("sbx-abcdefghij", write)
    for method, path, q in (("GET", "/files", "path=x"), ("PUT", "/files", query),
                            ("GET", "/files/x", query), ("GET", "/health", query)):
        assert signed_url(_request(method, path, q)) is None
    odd = signed_url(_request("GET", "/files", "signature=v1_x&signature_expiration=soon"))
    assert odd == SignedUrl("v1_x", "", "read", "", -1)  # never valid, and long expired

