"""Hostile clients against the gateway's E2B layer: a tenant (or anyone) sending what no
SDK sends. Each attack must be contained: a clear error for the attacker, the gateway still
serving everyone (still alive, memory bounded), other tenants' sandboxes untouched."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator

import httpx2 as httpx
import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration
MiB = 1 << 20


def _status(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` figure, in bytes (VmRSS, VmHWM: the peak RSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def _alive(gateway: E2BGateway) -> None:
    """The gateway process is still there and answers."""
    assert gateway.proc.proc is not None and gateway.proc.proc.poll() is None, \
        "the gateway process died"
    assert httpx.get(gateway.url + "/health", timeout=30).status_code == 200


@pytest.fixture
def own(e2b_env: E2BGateway) -> Iterator[object]:
    """A sandbox of key A: the attacker's own (its access token is all it needs)."""
    from e2b import Sandbox

    sb = Sandbox.create()
    yield sb
    sb.kill()


def _headers(sb: object, port: int = 49983, **extra: str) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sb.sandbox_id,  # type: ignore[attr-defined]
            "E2b-Sandbox-Port": str(port),
            "X-Access-Token": sb._envd_access_token, **extra}  # type: ignore[attr-defined]


def _envelope(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


def _stream_error(reply: httpx.Response) -> dict[str, str]:
    """The error of a Connect stream's end message (flag 2)."""
    data = reply.content
    while data:
        flag, size = data[0], struct.unpack(">I", data[1:5])[0]
        if flag & 2:
            return json.loads(data[5:5 + size])["error"]
        data = data[5 + size:]
    raise AssertionError(f"no end message in {reply.content[:200]!r}")


# Connect messages ----------------------------------------------------------------------

def test_deeply_nested_json_does_not_crash_the_gateway(e2b_gateway: E2BGateway,
                                                       own: object) -> None:
    """protobuf's native JSON parser has no depth limit: 100,000 nested arrays (200 KB)
    overflowed the C stack and killed the whole gateway, for every tenant."""
    deep = b"[" * 100_000 + b"]" * 100_000
    for body in (deep, b'{"path": "/tmp", "x": ' + deep + b"}"):
        reply = httpx.post(e2b_gateway.url + "/filesystem.Filesystem/Stat", content=body,
                           headers=_headers(own, **{"Content-Type": "application/json"}),
                           timeout=60)
        assert reply.status_code == 400, reply.text
        assert reply.json()["code"] == "invalid_argument"
        _alive(e2b_gateway)
    reply = httpx.post(e2b_gateway.url + "/process.Process/Start", content=_envelope(deep),
                       headers=_headers(own, **{"Content-Type": "application/connect+json"}),
                       timeout=60)
    assert _stream_error(reply)["code"] == "invalid_argument"
    _alive(e2b_gateway)
    reply = httpx.post(e2b_gateway.url + "/execute", content=deep, timeout=60,
                       headers=_headers(own, 49999, **{"Content-Type": "application/json"}))
    assert reply.status_code == 400 and "JSON" in reply.text
    _alive(e2b_gateway)


@pytest.mark.parametrize(("path", "ctype", "body"), [
    ("/process.Process/List", "application/proto", b"\xff" * 11),
    ("/process.Process/List", "application/json", b'{"x":'),
    ("/process.Process/List", "application/json", b"\xff\xfe"),
    ("/filesystem.Filesystem/Stat", "application/json", b'{"path": 5}'),
    ("/filesystem.Filesystem/Stat", "application/json", b'{"path": ["a"]}'),
    ("/process.Process/SendSignal", "application/json",
     b'{"process": {"pid": 99999999999999999999}}'),
])
def test_malformed_connect_messages_are_invalid_argument(
        e2b_gateway: E2BGateway, own: object, path: str, ctype: str, body: bytes) -> None:
    """Not Connect's ``unknown`` (a 500, with a traceback in the gateway's log)."""
    reply = httpx.post(e2b_gateway.url + path, content=body, timeout=30,
                       headers=_headers(own, **{"Content-Type": ctype}))
    assert reply.status_code == 400, reply.text
    assert reply.json()["code"] == "invalid_argument"
    assert "Traceback" not in reply.text


@pytest.mark.parametrize("path", ["/process.Process/Start", "/filesystem.Filesystem/WatchDir"])
def test_malformed_stream_requests_are_invalid_argument(e2b_gateway: E2BGateway, own: object,
                                                        path: str) -> None:
    for body in (b'{"x":', b'{"path": 7, "process": 7}'):
        reply = httpx.post(e2b_gateway.url + path, content=_envelope(body), timeout=30,
                           headers=_headers(own, **{"Content-Type": "application/connect+json"}))
        assert _stream_error(reply)["code"] == "invalid_argument", reply.content


# Addressing ----------------------------------------------------------------------------

@pytest.mark.parametrize("port", ["\u00b2", "\u00b9\u00b2", "4\u00b3", "4 9", "+1", "0x10"])
def test_port_header_with_non_ascii_digits(e2b_gateway: E2BGateway, port: str) -> None:
    """'²'.isdigit() is True, int('²') raises: was a 500 and a traceback, before any
    token was checked (anyone could)."""
    reply = httpx.get(e2b_gateway.url + "/health", headers={
        "E2b-Sandbox-Id": "sbx-abcdefghij", "E2b-Sandbox-Port": port.encode("latin-1"),
        "X-Access-Token": "t"})
    assert reply.status_code == 400, reply.text
    assert "E2b-Sandbox-Port" in reply.json()["message"]


# The control plane ----------------------------------------------------------------------

def test_control_plane_bodies_are_capped_before_the_key_is_checked(
        e2b_gateway: E2BGateway) -> None:
    """FastAPI reads a body whole before its dependencies (the API key) run: 300 MiB
    from a client without any key was held in the gateway's memory."""
    pid = e2b_gateway.proc.proc.pid  # type: ignore[union-attr]
    peak = _status(pid, "VmHWM")

    def body() -> Iterator[bytes]:  # chunked: no Content-Length to refuse it by
        yield b'{"templateID": "base", "metadata": {"k": "'
        for _ in range(300):
            yield b"a" * MiB
        yield b'"}}'

    for url in ("/sandboxes", "/v2/sandboxes"):
        try:
            reply = httpx.post(e2b_gateway.url + url, content=body(), timeout=120,
                               headers={"Content-Type": "application/json"})
            assert reply.status_code == 413, reply.text
            assert "MiB" in reply.json()["message"]
        except httpx.TransportError:
            pass  # the gateway answered 413 and closed while the body was still going
    _alive(e2b_gateway)
    assert _status(pid, "VmHWM") - peak < 150 * MiB
    # A normal create is untouched by the cap.
    reply = httpx.post(e2b_gateway.url + "/sandboxes", json={"templateID": "nope"},
                       headers={"X-API-KEY": e2b_gateway.keys["a"]}, timeout=60)
    assert reply.status_code in (400, 404), reply.text


def test_websockets_and_grpc_to_envd_get_clear_refusals(e2b_gateway: E2BGateway,
                                                        own: object) -> None:
    """envd and the code interpreter speak HTTP (Connect): a WebSocket or gRPC (which
    needs trailers) was a 500 and a traceback."""
    import asyncio

    import websockets

    async def upgrade(port: int, path: str) -> None:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect("ws" + e2b_gateway.url[4:] + path, open_timeout=30,
                                          additional_headers=_headers(own, port)):
                pass
        assert refused.value.response.status_code == 403  # closed before accepting

    for port, path in ((49983, "/process.Process/List"), (49983, "/files"),
                       (49999, "/execute")):
        asyncio.run(upgrade(port, path))
    reply = httpx.post(e2b_gateway.url + "/process.Process/List", content=_envelope(b""),
                       headers=_headers(own, **{"Content-Type": "application/grpc"}), timeout=30)
    assert reply.status_code == 415 and "gRPC" in reply.json()["message"]
    reply = httpx.post(e2b_gateway.url + "/process.Process/List", content=b"{}",
                       headers=_headers(own, **{"Content-Type": "application/json"}), timeout=30)
    assert reply.status_code == 200
    _alive(e2b_gateway)


def _guest_peak(gateway: E2BGateway, sb: object) -> int:
    """The peak RSS of the sandbox's guest agent (its pid 1), read through envd's files
    API: it takes no command slot (the floods hold them all)."""
    reply = httpx.get(gateway.url + "/files", params={"path": "/proc/1/status"},
                      headers=_headers(sb), timeout=60)
    assert reply.status_code == 200, reply.text
    for line in reply.text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in the guest's status: {reply.text[:300]!r}")


def _first_event(conn: socket.socket) -> bytes:
    """Read a Process/Start stream only until its first message: the process's start
    (``"start"``) or the call's refusal. What comes after is left unread."""
    seen = b""
    while b'"start"' not in seen and b"resource_exhausted" not in seen:
        data = conn.recv(4096)
        assert data and len(seen) < 64 << 10, f"no first event in {seen[:300]!r}"
        seen += data
    return seen


def test_unread_output_floods_stay_bounded(e2b_gateway: E2BGateway, own: object) -> None:
    """A tenant starts one more endless-output command than its quota allows (32) and never
    reads them: exactly one is refused by the quota; the others are held back all the way
    to the programs (envd events of at most 64 KiB, a stream's queue bounded in bytes, the
    guest's backlog 1 MiB a client, then a 2 s stall) instead of buffered: the gateway
    grows by a few MiB a stream (it was 32-event queues of up to 1 MiB events, growing
    with time), the guest's peak stays below 256 MiB (its 8 MiB backlogs took it to ~460:
    OOM-killed in a 256 MiB sandbox), and the gateway still serves."""
    import time

    pid = e2b_gateway.proc.proc.pid  # type: ignore[union-attr]
    sandbox_id = own.sandbox_id  # type: ignore[attr-defined]
    before = _status(pid, "VmRSS")
    body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "yes " + "A" * 60]}})
    message = _envelope(body.encode())
    head = "".join(f"{k}: {v}\r\n" for k, v in _headers(own).items())
    streams: list[socket.socket] = []
    try:
        for _ in range(33):
            conn = socket.create_connection(("127.0.0.1", e2b_gateway.proc.port))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.settimeout(60)
            conn.sendall(f"POST /process.Process/Start HTTP/1.1\r\nHost: x\r\n{head}"
                         "Content-Type: application/connect+json\r\n"
                         f"Content-Length: {len(message)}\r\n\r\n".encode() + message)
            streams.append(conn)
        firsts = [_first_event(conn) for conn in streams]
        refused = [first for first in firsts if b"resource_exhausted" in first]
        assert len(refused) == 1, f"{len(refused)} of 33 streams refused (one expected)"
        time.sleep(10)  # not a timing assertion: time for the floods to fill what they can
        grown = _status(pid, "VmRSS") - before
        # ~80 MiB (~320 before, and growing); the guest ~160 MiB at its peak (~460 before).
        assert grown < 160 * MiB, f"the gateway grew by {grown / MiB:.0f} MiB"
        peak = _guest_peak(e2b_gateway, own)
        assert peak < 256 * MiB, f"the guest's peak RSS was {peak / MiB:.0f} MiB"
        _alive(e2b_gateway)
    finally:
        e2b_gateway.kill_sandbox(sandbox_id)
        for conn in streams:
            conn.close()
