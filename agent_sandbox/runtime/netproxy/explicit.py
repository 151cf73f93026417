"""Connections to 10.255.255.1:3128: an explicit proxy (HTTPS_PROXY=http://10.255.255.1:3128)
— ``CONNECT host:port`` or an absolute-form request — decided by name like the rest."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

from agent_sandbox.runtime.netproxy.peek import MAX_PEEK, Hello, inspect

if TYPE_CHECKING:
    from agent_sandbox.runtime.netproxy.tcp import TcpProxy

_CONNECT = re.compile(rb"^CONNECT ([A-Za-z0-9.-]{1,253}):(\d{1,5}) HTTP/1\.[01]\r\n")
_ABSOLUTE = re.compile(rb"^[A-Z]{3,12} http://([A-Za-z0-9.-]{1,253})(?::(\d{1,5}))?[/?\s]")
_HOP_HEADERS = (b"connection", b"proxy-connection", b"keep-alive")
_ABSOLUTE_PREFIX = re.compile(rb"^([A-Z]{3,12} )http://[A-Za-z0-9.-]{1,253}(?::\d{1,5})?/?")


async def handle(proxy: TcpProxy, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    from agent_sandbox.runtime.netproxy.tcp import (
        decide,
        decide_name,
        is_address,
        read_hello,
        reset,
        unreadable,
    )

    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return reset(writer)
    if len(head) > MAX_PEEK:
        return reset(writer)
    connect = _CONNECT.match(head)
    match = connect or _ABSOLUTE.match(head)
    if match is None:
        return proxy.refuse(writer, Hello("http"), "proxy request",
                            "only CONNECT and absolute http:// requests are proxied")
    host = match.group(1).decode().lower().rstrip(".")
    port = int(match.group(2) or 80)
    if not 0 < port < 65536:
        return reset(writer)
    if not connect:
        hello = inspect(head)  # its Host must agree with its target (peek._http)
        if hello.name != host:
            return proxy.refuse(writer, Hello("http"), f"{host}:{port}",
                                f"the request for {host} names another host, or none, in "
                                "its Host header")
    decision = await (decide(proxy.resolver, proxy.fake, host, None) if is_address(host)
                      else decide_name(proxy.resolver, host))
    if not decision.allowed:
        return proxy.refuse(writer, Hello("http"), f"{host}:{port}", decision.why)
    if connect:
        # The tunnel's own first bytes (SNI / Host) must ask for the same host: a tunnel to
        # an allowed name is not a way to another one.
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        head, hello = await read_hello(reader)
        why = unreadable(hello)
        if not why and hello.name is not None and hello.name != host:
            why = f"a tunnel to {host} may not ask for {hello.name}"
        if why:
            return proxy.refuse(writer, hello, f"{host}:{port}", why)
    else:  # the origin-form a server expects: "GET /path HTTP/1.1", one request only
        head = _one_request(_ABSOLUTE_PREFIX.sub(rb"\1/", head, count=1))
    await proxy.relay(reader, writer, decision.upstream, port, head)


def _one_request(head: bytes) -> bytes:
    """``Connection: close`` in place of the client's connection headers: the connection
    went to this request's host, so the next request (clients reuse a proxy connection
    for any host) must come on a new one, decided afresh."""
    lines = [line for line in head[:-4].split(b"\r\n")
             if line.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"
