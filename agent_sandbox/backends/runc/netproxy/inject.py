"""Secrets swapped in at the proxy. For a host a secret may go to, the proxy terminates
the sandbox's TLS (with the sandbox's own CA), reads the request head, puts the value
where the secret's rule says (one header, or one query parameter) in place of the
placeholder (an ``inject`` rule: its header on every request, placeholder or not),
re-originates TLS to the real host (verified as usual) and relays; what the host answers
is relayed with every form of the value blanked out (same length, so the framing holds).
A placeholder anywhere a rule does not put it, or on a request to any other host the proxy
can read, is refused with a 403 naming the rule. One request per connection
(``Connection: close``): the next is read and decided afresh; a WebSocket upgrade keeps
its connection. Pure Python: no pydantic (the proxy runs with -S)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import socket
import ssl
import urllib.parse
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agent_sandbox.backends.runc.netproxy.peek import MAX_PEEK, inspect
from agent_sandbox.backends.runc.netproxy.relay import IDLE_TIMEOUT, reset
from agent_sandbox.backends.runc.netproxy.tlsstream import (
    TlsStream,
    client_context,
    server_context,
)

if TYPE_CHECKING:
    from agent_sandbox.backends.runc.netproxy.tcp import TcpProxy

PREFIX = b"abx-secret:"
_PREFIX_RE = re.compile(rb"abx-secret:([a-z0-9_-]{0,63})", re.IGNORECASE)
HANDSHAKE_DEADLINE = 10.0
_DROPPED = {b"connection", b"keep-alive", b"proxy-connection", b"accept-encoding",
            b"upgrade", b"te", b"http2-settings"}


def rule_hosts(rule: dict[str, Any]) -> set[tuple[str, int]]:
    out = set()
    for entry in rule["hosts"]:
        name, _, port = entry.partition(":")
        out.add((name, int(port) if port else 443))
    return out


class Secrets:
    """The sandbox's secrets as its proxy holds them."""

    def __init__(self, secrets: Iterable[dict[str, Any]], leaves: dict[str, tuple[str, str]],
                 upstream_ca: str = "") -> None:
        self.rules = list(secrets)
        self._leaves = leaves
        self._upstream_ca = upstream_ca
        self._servers: dict[str, ssl.SSLContext] = {}
        self._client: ssl.SSLContext | None = None
        self.hosts = {h for r in self.rules for h in rule_hosts(r)}

    def applies(self, name: str | None, port: int) -> bool:
        return name is not None and (name, port) in self.hosts

    def for_host(self, name: str, port: int) -> list[dict[str, Any]]:
        return [r for r in self.rules if (name, port) in rule_hosts(r)]

    def server(self, name: str) -> ssl.SSLContext:
        if name not in self._servers:
            self._servers[name] = server_context(*self._leaves[name])
        return self._servers[name]

    def client(self) -> ssl.SSLContext:
        if self._client is None:
            self._client = client_context(self._upstream_ca)
        return self._client

    def variants(self) -> list[bytes]:
        """Every form of every value a response could echo: as is, URL-quoted, and the
        base64 of basic auth."""
        out: set[bytes] = set()
        for rule in self.rules:
            value = rule["value"].encode()
            out |= {value, urllib.parse.quote(rule["value"], safe="").encode(),
                    base64.b64encode(value), rule["format"].replace("{}", rule["value"]).encode()}
        return sorted((v for v in out if len(v) >= 8), key=len, reverse=True)  # MIN_VALUE

    def describe(self, name: str) -> str:
        for rule in self.rules:
            if rule["name"] == name:
                how = (f"query parameter {rule['query']}" if rule.get("query") else
                       f"header {rule['header']}")
                return f"secret {name} goes only to {', '.join(rule['hosts'])} as {how}"
        return f"{name} is not a secret of this sandbox"


def carried(head: bytes) -> list[str]:
    """Names of the placeholders ``head`` carries anywhere: as is, URL-encoded, or inside
    a basic-auth token."""
    seen = [m.group(1).decode().lower() for m in _PREFIX_RE.finditer(head)]
    decoded = urllib.parse.unquote_to_bytes(head)
    seen += [m.group(1).decode().lower() for m in _PREFIX_RE.finditer(decoded)]
    for token in re.findall(rb"(?i)basic\s+([A-Za-z0-9+/=]{4,4096})", head):
        try:
            raw = base64.b64decode(token, validate=True)
        except (binascii.Error, ValueError):
            continue
        seen += [m.group(1).decode().lower() for m in _PREFIX_RE.finditer(raw)]
    return list(dict.fromkeys(seen))


def rewrite(head: bytes, name: str, port: int, secrets: Secrets) -> tuple[bytes, str]:
    """The head to send upstream (values in, hop headers out), or b"" and why not."""
    hello = inspect(head)
    if hello.kind != "http" or hello.name != name:
        return b"", (f"a request on a connection to {name} must be HTTP/1.1 naming {name} "
                     "(once) in its Host header")
    lines = head[:-4].split(b"\r\n")
    method, target, version = lines[0].split(b" ", 2)
    upgrade = any(line.split(b":", 1)[0].strip().lower() == b"upgrade" and
                  line.split(b":", 1)[1].strip().lower() == b"websocket" for line in lines[1:])
    out: list[bytes] = []
    for rule in secrets.for_host(name, port):
        token = rule["placeholder"].encode() if "placeholder" in rule else \
            PREFIX + rule["name"].encode()
        value = rule["value"]
        if rule.get("query"):
            target = _swap_query(target, rule["query"].encode(), token, value)
            continue
        wanted = rule["header"].lower().encode()
        sent = (base64.b64encode(value.encode()).decode() if rule.get("basic") else value)
        formatted = (rule["header"] + ": " + rule["format"].replace("{}", sent)).encode()
        if rule.get("inject"):  # set on every request: whatever the sandbox sent is dropped
            lines = [lines[0], *(line for line in lines[1:]
                                 if line.partition(b":")[0].strip().lower() != wanted),
                     formatted]
            continue
        for i, line in enumerate(lines[1:], 1):
            field, _, text = line.partition(b":")
            if field.strip().lower() == wanted and rule["name"] in carried(text):
                lines[i] = formatted
    for line in lines[1:]:
        field = line.split(b":", 1)[0].strip().lower()
        if field in _DROPPED and not (upgrade and field in (b"connection", b"upgrade")):
            continue
        out.append(line)
    rebuilt = b" ".join((method, target, version))
    left = carried(b"\r\n".join([rebuilt, *out]))
    if left:
        return b"", (f"the request to {name}:{port} carries the placeholder of "
                     f"{secrets.describe(left[0])}")
    tail = [b"Accept-Encoding: identity"]  # a compressed echo could not be blanked out
    tail += [b"Connection: Upgrade", b"Upgrade: websocket"] if upgrade and not any(
        line.split(b":", 1)[0].strip().lower() == b"upgrade" for line in out) else []
    tail += [] if upgrade else [b"Connection: close"]
    return b"\r\n".join([rebuilt, *out, *tail]) + b"\r\n\r\n", ""


def _swap_query(target: bytes, param: bytes, token: bytes, value: str) -> bytes:
    path, sep, query = target.partition(b"?")
    if not sep:
        return target
    parts = []
    for pair in query.split(b"&"):
        key, eq, val = pair.partition(b"=")
        if key == param and eq and urllib.parse.unquote_to_bytes(val) == token:
            pair = key + b"=" + urllib.parse.quote(value, safe="").encode()
        parts.append(pair)
    return path + b"?" + b"&".join(parts)


class Redactor:
    """A stream with every variant blanked out, even one split across chunks: the last
    (longest variant - 1) bytes wait for the next chunk."""

    def __init__(self, variants: list[bytes]) -> None:
        self.variants = variants
        self.keep = max((len(v) for v in variants), default=1) - 1
        self.pending = b""

    def feed(self, data: bytes) -> bytes:
        buf = self._blank(self.pending + data)
        if self.keep == 0:
            self.pending = b""
            return buf
        self.pending = buf[-self.keep:]
        return buf[:-self.keep]

    def end(self) -> bytes:
        out, self.pending = self.pending, b""
        return out

    def _blank(self, buf: bytes) -> bytes:
        for v in self.variants:
            if v in buf:
                buf = buf.replace(v, b"*" * len(v))
        return buf


async def _read_head(stream: TlsStream) -> tuple[bytes, bytes] | None:
    data = b""
    while (end := data.find(b"\r\n\r\n")) < 0:
        if len(data) >= MAX_PEEK:
            return None
        chunk = await stream.recv()
        if not chunk:
            return None
        data += chunk
    return data[:end + 4], data[end + 4:]


async def _refuse(stream: TlsStream, why: str) -> None:
    body = f"abx: refused by the sandbox's secret rules: {why}\n".encode()
    reason = "".join(c if " " <= c <= "~" else "?" for c in why)[:300].encode()
    await stream.sendall(b"HTTP/1.1 403 Forbidden by sandbox secret rules: %s\r\n"
                         b"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (reason, len(body), body))
    await stream.close_write()


async def terminate(proxy: TcpProxy, conn: socket.socket, first: bytes, name: str,
                    port: int, upstream: tuple[str, ...]) -> None:
    """The sandbox's TLS to ``name`` ended here; its request, with its secrets, sent on
    over verified TLS to the first of ``upstream`` that answers."""
    secrets = proxy.secrets
    assert secrets is not None
    client = TlsStream(conn, secrets.server(name), server_side=True, first=first)
    try:
        await asyncio.wait_for(client.handshake(), HANDSHAKE_DEADLINE)
        read = await asyncio.wait_for(_read_head(client), HANDSHAKE_DEADLINE)
    except (OSError, ssl.SSLError, TimeoutError):
        return reset(conn)
    if read is None:
        return reset(conn)
    head, rest = read
    sent, why = rewrite(head, name, port, secrets)
    if not sent:
        proxy.log.denied(f"secret: {why}")
        await _refuse(client, why)
        return conn.close()
    up = await proxy.open_upstream(upstream, port)
    if up is None:
        return reset(conn)
    server = TlsStream(up, secrets.client(), server_side=False, server_hostname=name)
    try:
        await asyncio.wait_for(server.handshake(), HANDSHAKE_DEADLINE)
        await server.sendall(sent + rest)
    except (OSError, ssl.SSLError, TimeoutError) as exc:
        proxy.log.denied(f"secret host {name}:{port}: TLS upstream failed: "
                         f"{type(exc).__name__}: {exc}")
        reset(up)
        await _refuse(client, f"the TLS connection to {name} could not be verified or made")
        return conn.close()
    await _relay(client, server, Redactor(secrets.variants()))


async def _pump(src: TlsStream, dst: TlsStream, redactor: Redactor | None) -> None:
    while True:
        data = await asyncio.wait_for(src.recv(), IDLE_TIMEOUT)
        if not data:
            if redactor is not None and (tail := redactor.end()):
                await dst.sendall(tail)
            await dst.close_write()
            return
        if redactor is not None:
            data = redactor.feed(data)
        if data:
            await dst.sendall(data)


async def _relay(client: TlsStream, server: TlsStream, redactor: Redactor) -> None:
    pumps = [asyncio.ensure_future(_pump(client, server, None)),
             asyncio.ensure_future(_pump(server, client, redactor))]
    try:
        done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in pumps:
            task.cancel()
        results = await asyncio.gather(*pumps, return_exceptions=True)
        failed = any(isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)
                     for r in results)
        for sock in (client.sock, server.sock):
            if failed:
                reset(sock)
            else:
                sock.close()
