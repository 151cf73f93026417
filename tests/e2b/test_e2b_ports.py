"""A server inside the sandbox, reached the way E2B's SDK users reach one in the single-URL
mode: the gateway's URL with ``E2b-Sandbox-Id``, ``E2b-Sandbox-Port`` and the sandbox's
access token (``E2B-Traffic-Access-Token`` or ``X-Access-Token``), or ``<port>-<id>.<domain>``
as the Host behind a reverse proxy. The token never reaches the server inside."""

from __future__ import annotations

import time

import httpx2 as httpx
import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration
_ECHO = ("import http.server, json\n"
         "class H(http.server.BaseHTTPRequestHandler):\n"
         "    def do_GET(self):\n"
         "        body = json.dumps(dict(self.headers)).encode()\n"
         "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
         "http.server.HTTPServer(('127.0.0.1', 8000), H).serve_forever()\n")


def test_a_sandbox_port_through_the_gateway(e2b_env: E2BGateway, e2b_sandbox: object) -> None:
    sandbox_id = e2b_sandbox.sandbox_id  # type: ignore[attr-defined]
    token = e2b_sandbox._envd_access_token  # type: ignore[attr-defined]
    ours = httpx.Client(base_url=f"{e2b_env.url}/v1/sandboxes/{sandbox_id}",
                        headers={"Authorization": f"Bearer {e2b_env.keys['a']}"}, timeout=30)
    ours.put("/files/content", params={"path": "/tmp/echo.py"},
             content=_ECHO.encode()).raise_for_status()
    ours.post("/processes", json={"cmd": "python3 /tmp/echo.py"}).raise_for_status()
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "8000",
               "E2B-Traffic-Access-Token": token}
    deadline = time.monotonic() + 30
    while True:
        reply = httpx.get(f"{e2b_env.url}/anything", headers=headers, timeout=30)
        if reply.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert reply.status_code == 200, reply.text
    seen = {k.lower() for k in reply.json()}
    assert not seen & {"x-access-token", "e2b-traffic-access-token", "e2b-sandbox-id"}
    by_host = httpx.get(f"{e2b_env.url}/x", headers={
        "Host": f"8000-{sandbox_id}.sandboxes.example", "X-Access-Token": token}, timeout=30)
    assert by_host.status_code == 200
    assert httpx.get(f"{e2b_env.url}/x", headers={**headers, "E2B-Traffic-Access-Token": "no"},
                     timeout=30).status_code == 401
