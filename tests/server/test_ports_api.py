"""Ports through the gateway: a routed URL per sandbox and port, behind the API key (HTTP,
100 at once, and WebSockets); another tenant's key and no key are refused; the caller's
credentials never reach the sandbox."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest
import websockets.sync.client as ws_client
from _gw import Gateway
from portservers import echoes, get, start

from agent_sandbox import Sandbox

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(gw: Gateway) -> Iterator[Sandbox]:
    sb = Sandbox.create(provider=gw.provider("a"))
    start(sb)
    yield sb
    sb.kill(delete_volume=True)


def test_http_behind_the_key(gw: Gateway, served: Sandbox) -> None:
    url = served.expose_port(8000)
    assert url == f"{gw.url}/v1/sandboxes/{served.sandbox_id}/ports/8000"
    key = {"Authorization": f"Bearer {gw.tokens['a']}"}
    assert get(f"{url}/hello.txt", key) == (200, b"hello from inside\n")
    status, body = get(f"{url}/hello.txt")
    assert status == 401 and b"API key" in body
    assert get(f"{url}/hello.txt", {"Authorization": f"Bearer {gw.tokens['b']}"})[0] == 404
    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        results = list(pool.map(lambda _: get(f"{url}/hello.txt", key), range(100)))
    assert results == [(200, b"hello from inside\n")] * 100


def test_the_key_is_not_forwarded(gw: Gateway, served: Sandbox) -> None:
    served.files.write("/tmp/headers.py", """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = str(dict(self.headers)).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 8001), H).serve_forever()
""")
    served.commands.run("python3 /tmp/headers.py", background=True)
    served.commands.run("for i in $(seq 50); do python3 -c \"import socket; "
                        "socket.create_connection(('127.0.0.1', 8001))\" && break; "
                        "sleep 0.1; done")
    status, body = get(f"{served.expose_port(8001)}/x?y=1",
                       {"Authorization": f"Bearer {gw.tokens['a']}", "X-Mine": "kept"})
    assert status == 200 and b"kept" in body, body
    assert gw.tokens["a"].encode() not in body and b"authorization" not in body.lower()


def test_websockets_behind_the_key(gw: Gateway, served: Sandbox) -> None:
    url = served.expose_port(9002).replace("http://", "ws://") + "/chat"
    with ws_client.connect(url, open_timeout=10, additional_headers={
            "Authorization": f"Bearer {gw.tokens['a']}"}) as ws:
        ws.send("ping")
        assert ws.recv(timeout=10) == "ping"
    with pytest.raises(Exception, match="4401|401|rejected"), \
            ws_client.connect(url, open_timeout=10) as ws:  # noqa: PT011
        ws.recv(timeout=5)


def test_plain_tcp_through_the_gateway(gw: Gateway, served: Sandbox) -> None:
    from agent_sandbox.surfaces.cli.port_tunnel import tunnel

    listener = tunnel(gw.provider("a"), served.sandbox_id, 9001)
    try:
        assert echoes(listener.getsockname(), 256 << 10)
    finally:
        listener.close()
    url = f"{gw.url.replace('http://', 'ws://')}/v1/sandboxes/{served.sandbox_id}/tcp/9001"
    with pytest.raises(Exception, match="4401|401|rejected"), \
            ws_client.connect(url, open_timeout=10) as ws:  # noqa: PT011
        ws.recv(timeout=5)
    with pytest.raises(Exception, match="4404|404|rejected"), \
            ws_client.connect(url, open_timeout=10, additional_headers={  # noqa: PT011
                "Authorization": f"Bearer {gw.tokens['b']}"}) as ws:
        ws.recv(timeout=5)
