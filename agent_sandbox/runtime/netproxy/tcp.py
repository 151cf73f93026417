"""Every TCP connection nft sends here: find where it was going (SO_ORIGINAL_DST: a name's
FAKE_RANGE address, or an address of the allowlist's CIDRs / of anywhere for ``full``)
and which name its first bytes ask for (SNI / Host), decide by the policy, then connect
to the real address and relay, or refuse at once (HTTP 403 naming the policy, else a
reset). A name's address used with another SNI/Host is refused: no domain fronting."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
from dataclasses import dataclass

from agent_sandbox.netpolicy import NetworkPolicy
from agent_sandbox.runtime.netproxy import explicit
from agent_sandbox.runtime.netproxy.config import GATEWAY, PROXY_PORT
from agent_sandbox.runtime.netproxy.fake import FakeAddresses, is_fake
from agent_sandbox.runtime.netproxy.log import Log
from agent_sandbox.runtime.netproxy.peek import MAX_PEEK, Hello, inspect
from agent_sandbox.runtime.netproxy.resolver import Resolver

SO_ORIGINAL_DST = 80
# Per sandbox: the proxy is a host process outside the sandbox's cgroup, so what a
# sandbox can make it hold is bounded here: at most MAX_RELAYS connections, each buffering
# a few CHUNKs per direction (~100 MiB at worst).
MAX_RELAYS = 256
CHUNK = 64 * 1024
FIRST_BYTES_WAIT = 1.0  # a client that says nothing first (SSH servers speak first...)
HELLO_DEADLINE = 10.0
CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Decision:
    allowed: bool
    why: str = ""
    upstream: tuple[str, ...] = ()  # the real addresses to connect to, in order


def original_destination(sock: socket.socket) -> tuple[str, int]:
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack("!2xH4s8x", raw)
    return socket.inet_ntoa(packed), port


def _denied_by_name(policy: NetworkPolicy, name: str) -> bool:
    return not NetworkPolicy(mode="full", deny_out=policy.deny_out).allows_name(name)


async def decide_name(resolver: Resolver, name: str) -> Decision:
    policy = resolver.config.policy
    if not policy.allows_name(name):
        return Decision(False, f"{name} is not allowed by network policy {policy.describe()}")
    found = await resolver.addresses(name)
    if not found:
        return Decision(False, f"{name} does not resolve to an address a sandbox may reach")
    return Decision(True, upstream=found)


async def decide(resolver: Resolver, fake: FakeAddresses, address: str,
                 name: str | None) -> Decision:
    """May the sandbox reach ``address`` (for ``name``, if its first bytes named one)?"""
    policy = resolver.config.policy
    if is_fake(address):
        target = fake.name_of(address)
        if target is None:
            return Decision(False, f"{address} stands for no name any more (look it up again)")
        if name is not None and name != target:
            return Decision(False, f"a connection to {target} may not ask for {name}")
        return await decide_name(resolver, target)
    if name is not None and is_address(name):  # "Host: 93.184.216.34"
        if name != address:
            return Decision(False, f"a connection to {address} may not ask for {name}")
        name = None
    if name is not None and _denied_by_name(policy, name):
        return Decision(False, f"{name} is denied by network policy {policy.describe()}")
    if resolver.config.is_blocked(address):
        return Decision(False, f"{address} is the host, a private or a link-local address, "
                               "which a sandbox never reaches")
    if policy.allows_address(address):
        return Decision(True, upstream=(address,))
    return Decision(False, f"{address} was reached by number, not by an allowed name "
                           f"(network policy {policy.describe()})")


class TcpProxy:
    def __init__(self, resolver: Resolver, fake: FakeAddresses, log: Log) -> None:
        self.resolver = resolver
        self.fake = fake
        self.log = log
        self._handling = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._handling += 1
        try:
            await self._handle(reader, writer)
        except Exception:  # noqa: BLE001 - one hostile connection never stops the proxy
            reset(writer)
        finally:
            self._handling -= 1

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._handling > MAX_RELAYS:
            self.log.denied(f"over {MAX_RELAYS} connections at once: refused")
            return reset(writer)
        address, port = original_destination(writer.get_extra_info("socket"))
        if address == GATEWAY:
            if port == PROXY_PORT:
                return await explicit.handle(self, reader, writer)
            return reset(writer)
        first, hello = await read_hello(reader)
        unnamed = unreadable(hello)
        decision = (Decision(False, unnamed) if unnamed else
                    await decide(self.resolver, self.fake, address, hello.name))
        if not decision.allowed:
            return self.refuse(writer, hello, f"{hello.name or address}:{port}", decision.why)
        await self.relay(reader, writer, decision.upstream, port, first)

    def refuse(self, writer: asyncio.StreamWriter, hello: Hello, target: str, why: str) -> None:
        self.log.denied(f"TCP {target}: {why}")
        if hello.kind == "http":
            body = f"abx: blocked by the sandbox network policy: {why}\n".encode()
            writer.write(b"HTTP/1.1 403 Forbidden by sandbox network policy\r\n"
                         b"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            writer.close()
            return
        reset(writer)

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    upstream: tuple[str, ...], port: int, first: bytes) -> None:
        for address in upstream[:4]:
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(address, port, limit=CHUNK), CONNECT_TIMEOUT)
                break
            except (OSError, TimeoutError):
                continue
        else:
            return reset(writer)
        up_writer.write(first)
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer),
                                 return_exceptions=True)
        finally:
            for w in (writer, up_writer):
                w.close()


def unreadable(hello: Hello) -> str:
    """Why the first bytes are refused before any policy is asked ("": they are not): an
    HTTP request whose host cannot be read one way, or first bytes that never finished
    (what the proxy did not see could name another host)."""
    if hello.kind == "http" and hello.name is None:
        return ("the HTTP request does not name its host one way (one Host header, CRLF "
                "line ends, an absolute-form target only for that host)")
    if hello.kind == "incomplete":
        return "its first bytes (a TLS ClientHello or an HTTP head) did not finish in time"
    return ""


async def read_hello(reader: asyncio.StreamReader) -> tuple[bytes, Hello]:
    """The first bytes (bounded) and what they say; a client silent for a moment is
    taken to wait for the server (no name); one that starts a ClientHello or an HTTP head
    and does not finish it is "incomplete"."""
    data = b""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HELLO_DEADLINE
    wait = FIRST_BYTES_WAIT
    while True:
        hello = inspect(data)
        if hello.kind != "partial" or len(data) >= MAX_PEEK:
            return data, hello
        try:
            chunk = await asyncio.wait_for(reader.read(MAX_PEEK - len(data)),
                                           min(wait, max(0.0, deadline - loop.time())))
        except TimeoutError:
            return data, Hello("incomplete" if data else "other")
        if not chunk:
            return data, Hello("incomplete" if data else "other")
        data += chunk
        wait = HELLO_DEADLINE


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, ConnectionError):
        writer.close()


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset: the client's next read or write fails at once."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
