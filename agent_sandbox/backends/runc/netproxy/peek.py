"""The name a connection is for, from its first bytes: TLS SNI or the HTTP Host header,
and reading those bytes (bounded in size and in time).

Bounded and total: any input (truncated, oversized, garbage) gives a Hello with or without
a name, never an exception.
"""

from __future__ import annotations

import asyncio
import re
import socket
from dataclasses import dataclass

MAX_PEEK = 16 * 1024 + 5  # one TLS record (a ClientHello fits one) or an HTTP head
_HTTP_METHOD = re.compile(rb"^[A-Z]{3,12} \S{1,8192} HTTP/1\.[01]\r?\n")
_HOST_CHARS = re.compile(r"^[A-Za-z0-9.-]{1,253}$")
_SPACED_NAME = re.compile(rb"^[!-9;-~]+[ \t]+:")  # "Host : x": read differently by servers


@dataclass(frozen=True)
class Hello:
    # "tls", "http", "other", "partial" (more bytes needed) or "incomplete" (partial, and
    # no more came in time: tcp.read_hello)
    kind: str
    name: str | None = None


def _u16(b: bytes, i: int) -> int:
    if i + 2 > len(b):
        raise IndexError
    return int.from_bytes(b[i:i + 2], "big")


def _sni(data: bytes) -> Hello:
    if len(data) < 5:
        return Hello("partial")
    need = 5 + _u16(data, 3)
    if len(data) < need:
        return Hello("partial" if need <= MAX_PEEK else "tls")
    try:
        body = data[5:need]
        if body[0] != 1:  # not a ClientHello
            return Hello("tls")
        i = 4 + 2 + 32  # handshake header, client_version, random
        i += 1 + body[i]  # session id
        i += 2 + _u16(body, i)  # cipher suites
        i += 1 + body[i]  # compression methods
        end = i + 2 + _u16(body, i)
        i += 2
        while i + 4 <= min(end, len(body)):
            kind, size = _u16(body, i), _u16(body, i + 2)
            i += 4
            if kind == 0:  # server_name: list length, then (type, length, name)
                if body[i + 2] != 0:
                    return Hello("tls")
                size = _u16(body, i + 3)
                return Hello("tls", _host(body[i + 5:i + 5 + size]))
            i += size
    except IndexError:
        pass
    return Hello("tls")


def _host(raw: bytes) -> str | None:
    try:
        text = raw.decode("ascii").strip().lower().rstrip(".")
    except UnicodeDecodeError:
        return None
    return text if _HOST_CHARS.match(text) else None


def _http(data: bytes) -> Hello:
    """An HTTP request head names its host only if it can be read one way: CRLF line ends
    throughout (a server that takes bare LF would read other headers than we did), one
    Host header, no folded or space-before-colon header lines, and an absolute-form target
    for the same host. Anything else is an HTTP request with no name (refused)."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        if b"\n\n" in data or b"\n\r\n" in data:  # a head that ends with bare LF
            return Hello("http")
        return Hello("partial" if len(data) < MAX_PEEK else "http")
    head = data[:head_end]
    if head.count(b"\n") != head.count(b"\r\n"):
        return Hello("http")
    lines = head.split(b"\r\n")
    if any(line[:1] in (b" ", b"\t") or _SPACED_NAME.match(line) for line in lines[1:]):
        return Hello("http")
    hosts = [line[5:].strip() for line in lines[1:] if line[:5].lower() == b"host:"]
    if len(hosts) != 1:  # none, or two that could be read differently upstream
        return Hello("http")
    host = _host(_strip_port(hosts[0]))
    target = lines[0].split(b" ")[1]
    if target[:7].lower() == b"http://" or target[:8].lower() == b"https://":
        authority = target.split(b"//", 1)[1].split(b"/", 1)[0].split(b"?", 1)[0]
        if _host(_strip_port(authority)) != host:  # servers prefer the target's host
            return Hello("http")
    return Hello("http", host)


def _strip_port(host: bytes) -> bytes:
    if host.startswith(b"["):
        return b""  # an IPv6 literal: the sandbox is IPv4-only
    return host.rsplit(b":", 1)[0] if b":" in host else host


def inspect(data: bytes) -> Hello:
    """What ``data`` (the first bytes the client sent) says about where it is going."""
    if not data:
        return Hello("partial")
    if data[0] == 0x16:
        return _sni(data[:MAX_PEEK])
    if _HTTP_METHOD.match(data[:8300]) or (len(data) < 16 and data.isalpha() and data.isupper()):
        return _http(data[:MAX_PEEK]) if _HTTP_METHOD.match(data[:8300]) else Hello("partial")
    return Hello("other")


FIRST_BYTES_WAIT = 1.0  # a client that says nothing first (SSH servers speak first...)
HELLO_DEADLINE = 10.0


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
