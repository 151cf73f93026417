"""API keys: required once any exists, checked per request, hashed at rest."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import websockets
import websockets.sync.client
from _gw import Gateway

from agent_sandbox import Sandbox
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.remote import RemoteProvider, UnauthenticatedError
from agent_sandbox.surfaces.gateway.process import GatewayProcess
from agent_sandbox.surfaces.gateway.serve import check_bind, is_loopback
from agent_sandbox.surfaces.http.keys import KeyStore

pytestmark = [pytest.mark.integration, pytest.mark.quick]


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    """This module's subject is the gateway itself: on the memory backend."""
    return gw_memory


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
    out = subprocess.run([sys.executable, "-m", "agent_sandbox.surfaces.gateway", "keys", "revoke",
                          key.id, "--api-keys-file", str(gw.keys.path)],
                         capture_output=True, text=True, check=True).stdout
    assert '"revoked": true' in out
    with pytest.raises(UnauthenticatedError, match="revoked"):
        provider.list()


def test_keys_are_hashed_at_rest_and_listing_hides_them(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    cli = [sys.executable, "-m", "agent_sandbox.surfaces.gateway", "keys"]
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
        _open_gateway_refuses_web_pages(proc.url)
    finally:
        proc.stop()


def test_open_gateway_confines_a_sandbox_page(tmp_path: Path) -> None:
    """No keys: the gateway's loopback origin is itself the authority, and a sandbox's
    page relayed through the port proxy is of that origin. Unconfined, its script could
    drive the gateway as an admin (every sandbox, any network) from the user's browser;
    it must run as an opaque origin, whose calls the open gateway refuses."""
    proc = GatewayProcess(keys_file=str(tmp_path / "none.db")).start()
    try:
        sb = Sandbox.create(provider=RemoteProvider(proc.url, None))
        try:
            sb.files.write("/workspace/index.html", "<script>fetch('/v1/sandboxes')</script>")
            sb.commands.run("cd /workspace && exec python3 -m http.server 8000 "
                            "--bind 127.0.0.1", background=True)
            with httpx.Client(base_url=proc.url, timeout=30) as http:
                for _ in range(300):
                    page = http.get(f"/v1/sandboxes/{sb.sandbox_id}/ports/8000/")
                    if page.status_code == 200:
                        break
                    time.sleep(0.05)
                assert page.status_code == 200 and "<script>" in page.text, page.text
                assert page.headers.get("content-security-policy", "").startswith("sandbox")
                for path in ("/s/shr-x/", "/share/tok"):
                    csp = http.get(path).headers.get("content-security-policy", "")
                    assert csp.startswith("sandbox"), path
                # What the confined page's script sends: Origin null.
                assert http.get("/v1/sandboxes", headers={"Origin": "null"}).status_code == 403
        finally:
            sb.kill(delete_volume=True)
    finally:
        proc.stop()


def _open_gateway_refuses_web_pages(url: str) -> None:
    """No keys: a page in the user's browser must not drive it, by a cross-site form post
    or by a name of its own re-pointed at 127.0.0.1 (DNS rebinding)."""
    port = url.rsplit(":", 1)[1]
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.get("/v1/templates").status_code == 200
        for host in (f"localhost:{port}", f"[::1]:{port}", f"x.localhost:{port}"):
            assert http.get("/v1/templates", headers={"Host": host}).status_code == 200, host
        rebound = http.get("/v1/templates", headers={"Host": f"evil.example:{port}"})
        assert rebound.status_code == 403 and "loopback name" in rebound.json()["message"]
        assert rebound.json()["code"] == "permission_denied"
        form = http.post("/v1/sandboxes/sbx-aaaaaaaaaa/pause",
                         headers={"Origin": "https://evil.example",
                                  "Content-Type": "application/x-www-form-urlencoded"})
        assert form.status_code == 403 and "another origin" in form.json()["message"]
        own = http.get("/v1/templates", headers={"Origin": f"http://127.0.0.1:{port}"})
        assert own.status_code == 200
    ws = url.replace("http", "ws", 1) + "/v1/sandboxes/sbx-aaaaaaaaaa/pty"
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        websockets.sync.client.connect(ws, origin="https://evil.example").close()
    assert refused.value.response.status_code == 403


def test_binding_beyond_loopback_needs_a_key(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    keys = KeyStore(tmp_path / "k.db")
    with pytest.raises(InvalidArgumentError, match="no API key"):
        check_bind("0.0.0.0", keys)
    check_bind("127.0.0.1", keys)
    r = subprocess.run([sys.executable, "-m", "agent_sandbox.surfaces.gateway", "serve", "--host",
                        "0.0.0.0", "--port", "1", "--api-keys-file", str(tmp_path / "k.db")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "refusing to listen on 0.0.0.0" in r.stderr
    key, _ = keys.create("ops")
    check_bind("0.0.0.0", keys)
    keys.revoke(key.id)
    with pytest.raises(InvalidArgumentError):
        check_bind("0.0.0.0", keys)
