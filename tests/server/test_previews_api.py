"""Share links through the gateway's API, SDK and CLI (memory backend: the gateway's
checks, mapping, errors and tenancy). The browser's side is test_previews_browser.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
from _gw import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.quick]
ABX = [sys.executable, "-m", "agent_sandbox.surfaces.cli"]


@pytest.fixture(scope="session")
def gw(gw_memory: Gateway) -> Gateway:
    return gw_memory


def test_share_links_are_checked_owned_and_revocable(gw: Gateway) -> None:
    a = gw.provider("a")
    sandbox_id = a.create().sandbox_id
    try:
        with gw.http("a") as http:
            url = f"/v1/sandboxes/{sandbox_id}/shares"
            for body, said in (({"port": 0}, "port"), ({"port": 80, "expires_in": 0}, ""),
                               ({"port": 80, "expires_in": 1e9}, ""),
                               ({"port": 80, "extra": 1}, "")):
                bad = http.post(url, json=body)
                assert bad.status_code == 400 and said in bad.text, bad.text
            public = http.post(url, json={"port": 80, "public": True})
            assert public.status_code == 403
            assert "ABX_GATEWAY_PUBLIC_PORTS" in public.json()["message"]
            made = http.post(url, json={"port": 80, "expires_in": 60})
            assert made.status_code == 201, made.text
            share = made.json()
            token = share["url"].rsplit("/", 1)[1]
            assert share["url"] == f"{gw.url}/share/{token}" and share["port"] == 80
            listed = http.get(url).json()
            assert [s["share_id"] for s in listed] == [share["share_id"]]
            assert token not in json.dumps(listed)
        with gw.http("b") as other:  # another tenant: no such sandbox
            assert other.post(url, json={"port": 80}).status_code == 404
            assert other.get(url).status_code == 404
            assert other.delete(f"{url}/{share['share_id']}").status_code == 404
        # The CLI: a link, and its revocation.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABX_SANDBOX_")}
        env.update(ABX_SANDBOX_BASE_URL=gw.url, ABX_SANDBOX_API_KEY=gw.tokens["a"],
                   HOME=tempfile.mkdtemp(prefix="abx-home-"))
        out = subprocess.run([*ABX, "sandbox", "port", sandbox_id, "8000", "--share",
                              "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        cli_share = json.loads(out.stdout)
        assert "/share/" in cli_share["url"] and cli_share["port"] == 8000
        out = subprocess.run([*ABX, "sandbox", "unshare", sandbox_id, cli_share["share_id"],
                              share["share_id"]], env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert a.list_port_shares(sandbox_id) == []
    finally:
        a.kill(sandbox_id, delete_volume=True)
