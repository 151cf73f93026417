"""Connections to 10.255.255.1:3128: an explicit proxy (HTTPS_PROXY=http://10.255.255.1:3128)
— ``CONNECT host:port`` or an absolute-form request — decided by name like the rest. A
tunnel's own first bytes must ask for its host; an absolute-form request is the only one
its connection carries (the next may be for another host: clients reuse a proxy
connection for any host)."""

from __future__ import annotations

import asyncio
import re
import socket
from typing import TYPE_CHECKING

from agent_sandbox.backends.runc.netproxy.decide import decide, decide_name, is_address, unreadable
from agent_sandbox.backends.runc.netproxy.peek import MAX_PEEK, Hello, inspect, read_hello
from agent_sandbox.backends.runc.netproxy.relay import reset

if TYPE_CHECKING:
    from agent_sandbox.backends.runc.netproxy.tcp import TcpProxy

HEAD_DEADLINE = 10.0
_CONNECT = re.compile(rb"^CONNECT ([A-Za-z0-9.-]{1,253}):(\d{1,5}) HTTP/1\.[01]\r\n")
_ABSOLUTE = re.compile(rb"^[A-Z]{3,12} http://([A-Za-z0-9.-]{1,253})(?::(\d{1,5}))?[/?\s]")
_HOP_HEADERS = (b"connection", b"proxy-connection", b"keep-alive")
_ABSOLUTE_PREFIX = re.compile(rb"^([A-Z]{3,12} )http://[A-Za-z0-9.-]{1,253}(?::\d{1,5})?/?")


async def read_head(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """The request head (to its blank line) and the bytes read past it; None if none
    came in time or it is over MAX_PEEK."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HEAD_DEADLINE
    data = b""
    while (end := data.find(b"\r\n\r\n")) < 0:
        if len(data) >= MAX_PEEK:
            return None
        try:
            chunk = await asyncio.wait_for(loop.sock_recv(conn, MAX_PEEK - len(data)),
                                           max(0.0, deadline - loop.time()))
        except TimeoutError:
            return None
        if not chunk:
            return None
        data += chunk
    return data[:end + 4], data[end + 4:]


async def handle(proxy: TcpProxy, conn: socket.socket) -> None:
    read = await read_head(conn)
    if read is None:
        return reset(conn)
    head, rest = read
    connect = _CONNECT.match(head)
    match = connect or _ABSOLUTE.match(head)
    if match is None:
        return proxy.refuse(conn, Hello("http"), "proxy request",
                            "only CONNECT and absolute http:// requests are proxied")
    host = match.group(1).decode().lower().rstrip(".")
    port = int(match.group(2) or 80)
    if not 0 < port < 65536:
        return reset(conn)
    if not connect and inspect(head).name != host:  # Host must agree (peek._http)
        return proxy.refuse(conn, Hello("http"), f"{host}:{port}",
                            f"the request for {host} names another host, or none, in its "
                            "Host header")
    decision = await (decide(proxy.resolver, proxy.fake, host, None) if is_address(host)
                      else decide_name(proxy.resolver, host))
    if not decision.allowed:
        return proxy.refuse(conn, Hello("http"), f"{host}:{port}", decision.why,
                            decision.logged)
    if connect:
        # The tunnel's own first bytes (SNI / Host) must ask for the same host: a tunnel to
        # an allowed name is not a way to another one.
        await asyncio.get_running_loop().sock_sendall(
            conn, b"HTTP/1.1 200 Connection established\r\n\r\n")
        first, hello = await read_hello(conn, rest)
        why = unreadable(hello)
        if not why and hello.name is not None and hello.name != host:
            if is_address(host):  # by number: decided as a transparent connection is
                why = (await decide(proxy.resolver, proxy.fake, host, hello.name)).why
            else:
                why = f"a tunnel to {host} may not ask for {hello.name}"
        if why:
            return proxy.refuse(conn, hello, f"{host}:{port}", why)
    else:  # the origin-form a server expects: "GET /path HTTP/1.1", one request only
        first = _one_request(_ABSOLUTE_PREFIX.sub(rb"\1/", head, count=1)) + rest
        hello = Hello("http", host)
    await proxy.forward(conn, hello, None if is_address(host) else host, port,
                        decision.upstream, first)


def _one_request(head: bytes) -> bytes:
    """``Connection: close`` in place of the client's connection headers: the connection
    went to this request's host, so the next request must come on a new one, decided
    afresh."""
    lines = [line for line in head[:-4].split(b"\r\n")
             if line.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"
