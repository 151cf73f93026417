"""API keys: required once any exists, checked per request, hashed at rest."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _gw import Gateway

from agent_sandbox.errors import InvalidArgumentError
from agent_sandbox.providers.remote import RemoteProvider, UnauthenticatedError
from agent_sandbox.server.keys import KeyStore
from agent_sandbox.server.process import GatewayProcess
from agent_sandbox.server.serve import check_bind, is_loopback

pytestmark = pytest.mark.integration


def test_missing_or_unknown_key_is_401(gw: Gateway) -> None:
    with gw.http() as http:
        r = http.get("/v1/sandboxes")
        assert r.status_code == 401
        assert r.json()["code"] == "unauthenticated" and "API key" in r.json()["message"]
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = http.get("/v1/sandboxes", headers={"Authorization": "Bearer abx_nope"})
        assert r.status_code == 401
        # X-API-Key works as well as a bearer token.
        ok = http.get("/v1/sandboxes", headers={"X-API-Key": gw.tokens["a"]})
        assert ok.status_code == 200
        assert http.get("/health").status_code == 200  # liveness needs no key
    with pytest.raises(UnauthenticatedError):
        RemoteProvider(gw.url, "abx_wrong").list()


def test_revoked_key_fails_on_its_next_request(gw: Gateway) -> None:
    key, token = gw.keys.create("short-lived")
    provider = RemoteProvider(gw.url, token)
    assert provider.list() == []
    # Revoked from another process, through the CLI, while the gateway runs.
    out = subprocess.run([sys.executable, "-m", "agent_sandbox.server", "keys", "revoke",
                          key.id, "--api-keys-file", str(gw.keys.path)],
                         capture_output=True, text=True, check=True).stdout
    assert '"revoked": true' in out
    with pytest.raises(UnauthenticatedError, match="revoked"):
        provider.list()


def test_keys_are_hashed_at_rest_and_listing_hides_them(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    cli = [sys.executable, "-m", "agent_sandbox.server", "keys"]
    out = subprocess.run([*cli, "create", "--name", "ci", "--api-keys-file", str(path)],
                         capture_output=True, text=True, check=True).stdout
    token = out.split('"token": "')[1].split('"')[0]
    assert token.startswith("abx_")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    for f in tmp_path.iterdir():  # the db and any WAL file
        assert token.encode() not in f.read_bytes()
    listed = subprocess.run([*cli, "list", "--api-keys-file", str(path)],
                            capture_output=True, text=True, check=True).stdout
    assert '"name": "ci"' in listed and token not in listed and "token" not in listed
    assert KeyStore(path).authenticate(token) is not None


def test_open_gateway_on_loopback_without_keys(tmp_path: Path) -> None:
    proc = GatewayProcess(keys_file=str(tmp_path / "none.db")).start()
    try:
        assert RemoteProvider(proc.url, None).list_templates()
    finally:
        proc.stop()


def test_binding_beyond_loopback_needs_a_key(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    keys = KeyStore(tmp_path / "k.db")
    with pytest.raises(InvalidArgumentError, match="no API key"):
        check_bind("0.0.0.0", keys)
    check_bind("127.0.0.1", keys)
    r = subprocess.run([sys.executable, "-m", "agent_sandbox.server", "serve", "--host",
                        "0.0.0.0", "--port", "1", "--api-keys-file", str(tmp_path / "k.db")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "refusing to listen on 0.0.0.0" in r.stderr
    key, _ = keys.create("ops")
    check_bind("0.0.0.0", keys)
    keys.revoke(key.id)
    with pytest.raises(InvalidArgumentError):
        check_bind("0.0.0.0", keys)
