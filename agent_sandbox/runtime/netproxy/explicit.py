"""Connections to 10.255.255.1:3128: an explicit proxy (HTTPS_PROXY=http://10.255.255.1:3128)
— ``CONNECT host:port`` or an absolute-form request — decided by name like the rest."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

from agent_sandbox.runtime.netproxy.peek import MAX_PEEK, Hello

if TYPE_CHECKING:
    from agent_sandbox.runtime.netproxy.tcp import TcpProxy

_CONNECT = re.compile(rb"^CONNECT ([A-Za-z0-9.-]{1,253}):(\d{1,5}) HTTP/1\.[01]\r\n")
_ABSOLUTE = re.compile(rb"^[A-Z]{3,12} http://([A-Za-z0-9.-]{1,253})(?::(\d{1,5}))?[/?\s]")
_ABSOLUTE_PREFIX = re.compile(rb"^([A-Z]{3,12} )http://[A-Za-z0-9.-]{1,253}(?::\d{1,5})?/?")


async def handle(proxy: TcpProxy, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
    from agent_sandbox.runtime.netproxy.tcp import decide, decide_name, is_address, reset

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
    decision = await (decide(proxy.resolver, proxy.fake, host, None) if is_address(host)
                      else decide_name(proxy.resolver, host))
    if not decision.allowed:
        return proxy.refuse(writer, Hello("http"), f"{host}:{port}", decision.why)
    if connect:
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        head = b""
    else:  # the origin-form a server expects: "GET /path HTTP/1.1"
        head = _ABSOLUTE_PREFIX.sub(rb"\1/", head, count=1)
    await proxy.relay(reader, writer, decision.upstream, port, head)
