"""Every TCP connection nft sends here: read its first bytes (bounded), decide
(decide.py), then connect to the real address and relay (relay.py), or refuse at once
(HTTP 403 naming the policy, else a reset). Connections to 10.255.255.1:3128 are the
explicit proxy (explicit.py)."""

from __future__ import annotations

import asyncio
import socket
import struct

from agent_sandbox.runtime.netproxy import explicit
from agent_sandbox.runtime.netproxy.config import GATEWAY, PROXY_PORT
from agent_sandbox.runtime.netproxy.decide import Decision, decide, unreadable
from agent_sandbox.runtime.netproxy.fake import FakeAddresses
from agent_sandbox.runtime.netproxy.log import Log
from agent_sandbox.runtime.netproxy.peek import MAX_PEEK, Hello, inspect
from agent_sandbox.runtime.netproxy.relay import relay, reset, send_and_close
from agent_sandbox.runtime.netproxy.resolver import Resolver

SO_ORIGINAL_DST = 80
# Per sandbox: the proxy is a host process outside the sandbox's cgroup, so what a
# sandbox can make it hold is bounded here: at most MAX_RELAYS connections, each with one
# relay.CHUNK buffer per direction (32 MiB at worst).
MAX_RELAYS = 256
FIRST_BYTES_WAIT = 1.0  # a client that says nothing first (SSH servers speak first...)
HELLO_DEADLINE = 10.0
CONNECT_TIMEOUT = 10.0


def original_destination(sock: socket.socket) -> tuple[str, int]:
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack("!2xH4s8x", raw)
    return socket.inet_ntoa(packed), port


class TcpProxy:
    def __init__(self, resolver: Resolver, fake: FakeAddresses, log: Log) -> None:
        self.resolver = resolver
        self.fake = fake
        self.log = log
        self._handling: set[asyncio.Task] = set()

    async def serve(self, listener: socket.socket) -> None:
        """Accept for ever; each connection is handled in its own task."""
        loop = asyncio.get_running_loop()
        listener.setblocking(False)
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE and the like: say so, breathe, go on
                self.log.info(f"accept failed: {exc}")
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            if len(self._handling) >= MAX_RELAYS:
                self.log.denied(f"over {MAX_RELAYS} connections at once: refused")
                reset(conn)
                continue
            task = loop.create_task(self.handle(conn))
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)

    async def handle(self, conn: socket.socket) -> None:
        try:
            await self._handle(conn)
        except Exception:  # noqa: BLE001 - one hostile connection never stops the proxy
            reset(conn)

    async def _handle(self, conn: socket.socket) -> None:
        address, port = original_destination(conn)
        if address == GATEWAY:
            if port == PROXY_PORT:
                return await explicit.handle(self, conn)
            return reset(conn)
        first, hello = await read_hello(conn)
        unnamed = unreadable(hello)
        decision = (Decision(False, unnamed) if unnamed else
                    await decide(self.resolver, self.fake, address, hello.name))
        if not decision.allowed:
            return self.refuse(conn, hello, f"{hello.name or address}:{port}", decision.why)
        await self.connect_and_relay(conn, decision.upstream, port, first)

    def refuse(self, conn: socket.socket, hello: Hello, target: str, why: str) -> None:
        self.log.denied(f"TCP {target}: {why}")
        if hello.kind != "http":
            return reset(conn)
        body = f"abx: blocked by the sandbox network policy: {why}\n".encode()
        send_and_close(conn, b"HTTP/1.1 403 Forbidden by sandbox network policy\r\n"
                             b"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    async def connect_and_relay(self, conn: socket.socket, upstream: tuple[str, ...],
                                port: int, first: bytes) -> None:
        """Connect to the first of ``upstream`` that answers (a reset to the client if
        none does), replay the bytes already read, then relay both ways."""
        loop = asyncio.get_running_loop()
        for address in upstream[:4]:
            up = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET,
                               socket.SOCK_STREAM)
            up.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(up, (address, port)),
                                       CONNECT_TIMEOUT)
                break
            except (OSError, TimeoutError):
                up.close()
        else:
            return reset(conn)
        try:
            if first:
                await loop.sock_sendall(up, first)
        except OSError:
            reset(up)
            return reset(conn)
        await relay(conn, up)


async def read_hello(conn: socket.socket, data: bytes = b"") -> tuple[bytes, Hello]:
    """The first bytes (bounded; ``data``: what was read already) and what they say; a
    client silent for a moment is taken to wait for the server (no name); one that starts
    a ClientHello or an HTTP head and does not finish it is "incomplete"."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HELLO_DEADLINE
    wait = HELLO_DEADLINE if data else FIRST_BYTES_WAIT
    while True:
        hello = inspect(data)
        if hello.kind != "partial" or len(data) >= MAX_PEEK:
            return data, hello
        try:
            chunk = await asyncio.wait_for(loop.sock_recv(conn, MAX_PEEK - len(data)),
                                           min(wait, max(0.0, deadline - loop.time())))
        except TimeoutError:
            return data, Hello("incomplete" if data else "other")
        if not chunk:
            return data, Hello("incomplete" if data else "other")
        data += chunk
        wait = HELLO_DEADLINE
