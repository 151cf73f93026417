"""Every TCP connection nft sends here: read its first bytes (bounded), decide
(decide.py), then connect to the real address and relay (relay.py), or refuse at once
(HTTP 403 naming the policy, else a reset). Connections to 10.255.255.1:3128 are the
explicit proxy (explicit.py)."""

from __future__ import annotations

import asyncio
import socket
import struct

from agent_sandbox.backends.runc.netproxy import explicit, inject
from agent_sandbox.backends.runc.netproxy.config import GATEWAY, PROXY_PORT
from agent_sandbox.backends.runc.netproxy.decide import Decision, decide, decide_name, unreadable
from agent_sandbox.backends.runc.netproxy.fake import FakeAddresses, is_fake
from agent_sandbox.backends.runc.netproxy.log import Log
from agent_sandbox.backends.runc.netproxy.peek import Hello, read_hello
from agent_sandbox.backends.runc.netproxy.relay import relay, reset, send_and_close
from agent_sandbox.backends.runc.netproxy.resolver import Resolver

SO_ORIGINAL_DST = 80
# Per sandbox: the proxy is a host process outside the sandbox's cgroup, so what a
# sandbox can make it hold is bounded here: at most MAX_RELAYS connections, each with one
# relay.CHUNK buffer per direction (32 MiB at worst).
MAX_RELAYS = 256
CONNECT_TIMEOUT = 10.0
_MAX_REASON = 400  # characters of the refusal in a 403's status line


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
        config = resolver.config
        self.secrets = (inject.Secrets(config.secrets, config.leaves, config.upstream_ca)
                        if config.secrets else None)

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
        except Exception as exc:  # noqa: BLE001 - one hostile connection never stops the proxy
            if not isinstance(exc, OSError):  # a peer's reset is routine; anything else a bug
                self.log.denied(f"TCP connection reset on an error: {type(exc).__name__}: {exc}")
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
            return self.refuse(conn, hello, f"{hello.name or address}:{port}", decision.why,
                               decision.logged)
        name = hello.name or (self.fake.name_of(address) if is_fake(address) else None)
        await self.forward(conn, hello, name, port, decision.upstream, first)

    async def forward(self, conn: socket.socket, hello: Hello, name: str | None, port: int,
                      upstream: tuple[str, ...], first: bytes) -> None:
        """An allowed connection: TLS to a secret's host is terminated (inject.py), a
        plain HTTP request carrying a secret's placeholder refused, the rest relayed."""
        if self.secrets is not None:
            if hello.kind == "tls" and self.secrets.applies(name, port):
                assert name is not None
                # The name's own addresses, never one the sandbox connected to by number
                # with the name as its SNI (verification would refuse it; never try).
                named = await decide_name(self.resolver, name)
                if not named.allowed:
                    return self.refuse(conn, hello, f"{name}:{port}", named.why, named.logged)
                return await inject.terminate(self, conn, first, name, port, named.upstream)
            if hello.kind == "http" and (carried := inject.carried(first)):
                return self.refuse(conn, hello, f"{name}:{port}",
                                   "a secret's placeholder is sent only over HTTPS, to "
                                   f"its hosts: {self.secrets.describe(carried[0])}")
        await self.connect_and_relay(conn, upstream, port, first)

    def refuse(self, conn: socket.socket, hello: Hello, target: str, why: str,
               logged: str = "") -> None:
        """Log ``logged`` (else ``why``), then an HTTP client gets a 403 saying ``why`` in
        its status line too (what pip and requests show of a refused CONNECT), any other
        a reset."""
        self.log.denied(f"TCP {target}: {logged or why}")
        if hello.kind != "http":
            return reset(conn)
        body = f"abx: blocked by the sandbox network policy: {why}\n".encode()
        reason = "".join(c if " " <= c <= "~" else "?" for c in why)[:_MAX_REASON].encode()
        send_and_close(conn, b"HTTP/1.1 403 Forbidden by sandbox network policy: %s\r\n"
                             b"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (reason, len(body), body))

    async def connect_and_relay(self, conn: socket.socket, upstream: tuple[str, ...],
                                port: int, first: bytes) -> None:
        """Connect to the first of ``upstream`` that answers (a reset to the client if
        none does), replay the bytes already read, then relay both ways."""
        loop = asyncio.get_running_loop()
        up = await self.open_upstream(upstream, port)
        if up is None:
            return reset(conn)
        try:
            if first:
                await loop.sock_sendall(up, first)
        except OSError:
            reset(up)
            return reset(conn)
        await relay(conn, up)

    async def open_upstream(self, upstream: tuple[str, ...], port: int) -> socket.socket | None:
        """A connection to the first of ``upstream`` (at most four tried) that answers."""
        loop = asyncio.get_running_loop()
        for address in upstream[:4]:
            up = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET,
                               socket.SOCK_STREAM)
            up.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(up, (address, port)),
                                       CONNECT_TIMEOUT)
                return up
            except (OSError, TimeoutError):
                up.close()
        return None
