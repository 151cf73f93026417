"""E2B's sandbox addressing and access tokens, in-process: what the router reads from a
request, and that tokens are per sandbox, per gateway, stable across restarts, and kept in
a 0600 file."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.surfaces.e2b.routing import addressed, username
from agent_sandbox.surfaces.e2b.tokens import SECRET_FILE, AccessTokens


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
