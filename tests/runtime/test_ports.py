"""Ports on the embedded engine: servers inside a sandbox whose network is off, reached
from the host through the guest channel — HTTP (100 at once), raw TCP and WebSockets."""

from __future__ import annotations

import concurrent.futures
import socket
import time
from collections.abc import Iterator

import pytest
import websockets.sync.client as ws_client
from portservers import echoes, get, start

from agent_sandbox import Sandbox
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served() -> Iterator[Sandbox]:
    sb = Sandbox.create()  # network off
    start(sb)
    yield sb
    sb.kill(delete_volume=True)


def test_http_inside_reached_from_the_host(served: Sandbox) -> None:
    url = served.expose_port(8000)
    assert url.startswith("http://127.0.0.1:")
    assert served.expose_port(8000) == url  # one forward per port
    assert served.get_host(8000) == url.removeprefix("http://")
    assert get(f"{url}/hello.txt") == (200, b"hello from inside\n")
    with concurrent.futures.ThreadPoolExecutor(100) as pool:
        results = list(pool.map(lambda _: get(f"{url}/hello.txt"), range(100)))
    assert results == [(200, b"hello from inside\n")] * 100


def test_raw_tcp_and_websockets(served: Sandbox) -> None:
    host, port = served.get_host(9001).split(":")
    assert echoes((host, int(port)), 1 << 20)  # 1 MiB, both ways
    with ws_client.connect(f"ws://{served.get_host(9002)}/chat", open_timeout=10) as ws:
        ws.send("ping")
        assert ws.recv(timeout=10) == "ping"
        ws.send(b"\x00\x01")
        assert ws.recv(timeout=10) == b"\x00\x01"


def test_nothing_listening_closes_at_once(served: Sandbox) -> None:
    host, port = served.get_host(9999).split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        try:
            assert s.recv(100) == b""  # closed, nothing else
        except ConnectionResetError:
            pass  # or reset: it had unread bytes
    assert time.monotonic() - started < 5


def test_bad_ports_and_gone_sandboxes() -> None:
    sb = Sandbox.create()
    try:
        for bad in (0, 65536, -1, "80", True):
            with pytest.raises(InvalidArgumentError, match="is not a TCP port"):
                sb.expose_port(bad)  # type: ignore[arg-type]
        address = sb.get_host(8000).split(":")
    finally:
        sb.kill(delete_volume=True)
    with pytest.raises(ConnectionRefusedError):  # the forward ended with the sandbox
        socket.create_connection((address[0], int(address[1])), timeout=5)
    with pytest.raises(NotFoundError):
        sb.expose_port(8000)
