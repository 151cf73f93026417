"""Secrets swapped in at the proxy. For a host a secret may go to, the proxy terminates
the sandbox's TLS (with the sandbox's own CA), reads the request head, puts the value
where the secret's rule says (one header, or one query parameter) in place of the
placeholder (an ``inject`` rule: its header on every request, placeholder or not),
re-originates TLS to the real host (verified as usual) and relays; what the host answers
is relayed with every form of the value blanked out (same length, so the framing holds; a
chunked body de-chunked to be read; an encoded one, which could not be read, refused).
A placeholder anywhere a rule does not put it, or on a request to any other host the proxy
can read, is refused with a 403 naming the rule. One request per connection
(``Connection: close``): the next is read and decided afresh; a WebSocket upgrade keeps
its connection. Pure Python: no pydantic (the proxy runs with -S)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import html
import json
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
# Hop headers, and what would let the answer come encoded (a compressed body or WebSocket
# messages) where blanking could not see the value.
_DROPPED = {b"connection", b"keep-alive", b"proxy-connection", b"accept-encoding",
            b"upgrade", b"te", b"http2-settings", b"sec-websocket-extensions"}
MAX_ANSWER_HEAD = 64 * 1024  # an answer's head, a chunk's size line, its trailers
_CHUNK_SIZE = re.compile(rb"^[0-9A-Fa-f]{1,15}$")


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
        """Every form of every value a response could echo: as is and as the formatted
        header, each also escaped as in a JSON string (its slashes too, as some encoders
        do) and in HTML; URL-quoted (either case of hex, spaces as + too); the base64 of
        basic auth."""
        out: set[str] = set()
        for rule in self.rules:
            value = rule["value"]
            quoted = urllib.parse.quote(value, safe="")
            out |= {quoted, re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), quoted),
                    urllib.parse.quote_plus(value, safe=""),
                    base64.b64encode(value.encode()).decode()}
            for text in (value, rule["format"].replace("{}", value)):
                escaped = json.dumps(text)[1:-1]
                out |= {text, escaped, escaped.replace("/", "\\/"), html.escape(text),
                        html.escape(text, quote=False)}
        return sorted((v.encode() for v in out if len(v) >= 8), key=len,  # MIN_VALUE
                      reverse=True)

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

    def blank(self, buf: bytes) -> bytes:
        """``buf`` (a whole piece: a head) with every variant blanked out, nothing held."""
        return self._blank(buf)

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


async def _refuse(stream: TlsStream, why: str, status: bytes = b"403 Forbidden") -> None:
    body = f"abx: refused by the sandbox's secret rules: {why}\n".encode()
    reason = "".join(c if " " <= c <= "~" else "?" for c in why)[:300].encode()
    await stream.sendall(b"HTTP/1.1 %s by sandbox secret rules: %s\r\n"
                         b"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (status, reason, len(body), body))
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
    answer = _Answer(server, client, Redactor(secrets.variants()), name,
                     head.split(b" ", 1)[0] == b"HEAD")
    await _relay(client, server, answer)


async def _pump(src: TlsStream, dst: TlsStream) -> None:
    while True:
        data = await asyncio.wait_for(src.recv(), IDLE_TIMEOUT)
        if not data:
            await dst.close_write()
            return
        await dst.sendall(data)


class _Answer:
    """The host's answer on its way to the sandbox, every form of the value blanked out:
    its heads whole (1xx ones, then the final one), a chunked body de-chunked so that the
    value split across chunks is seen (and chunked again), the rest as it comes. An answer
    whose body blanking could not read (a Content-Encoding, a transfer coding other than
    chunked, a WebSocket extension) is refused with a 502: it is never relayed."""

    def __init__(self, server: TlsStream, client: TlsStream, redactor: Redactor, name: str,
                 head_request: bool) -> None:
        self.server, self.client, self.redactor = server, client, redactor
        self.name, self.head_request = name, head_request
        self.buf = b""

    async def _more(self) -> bool:
        data = await asyncio.wait_for(self.server.recv(), IDLE_TIMEOUT)
        self.buf += data
        return bool(data)

    async def _until(self, marker: bytes) -> bytes:
        """The bytes up to and with ``marker`` (at most MAX_ANSWER_HEAD of them)."""
        while (end := self.buf.find(marker)) < 0:
            if len(self.buf) > MAX_ANSWER_HEAD or not await self._more():
                raise ConnectionResetError(f"the answer of {self.name} is cut or too long")
        out, self.buf = self.buf[:end + len(marker)], self.buf[end + len(marker):]
        return out

    async def run(self) -> None:
        while True:
            if not self.buf and not await self._more():
                return await self.client.close_write()
            head = await self._until(b"\r\n\r\n")
            status, fields = _answer_head(head)
            encoded = [v for v in fields.get(b"content-encoding", []) if v != b"identity"] + \
                [v for v in fields.get(b"transfer-encoding", []) if v != b"chunked"] + \
                fields.get(b"sec-websocket-extensions", [])
            if encoded:
                return await _refuse(self.client, f"the answer of {self.name} is encoded "
                                     f"({b', '.join(encoded).decode(errors='replace')}), "
                                     "which would hide a secret's value from blanking",
                                     b"502 Bad Gateway")
            await self.client.sendall(self.redactor.blank(head))
            if not (100 <= status < 200 and status != 101):
                break
        if b"chunked" in fields.get(b"transfer-encoding", []) and status not in (204, 304) \
                and not self.head_request:
            await self._dechunk()
        else:
            if self.buf:
                await self.client.sendall(self.redactor.feed(self.buf))
            await _pump_blanked(self.server, self.client, self.redactor)
            return
        await self.client.close_write()

    async def _dechunk(self) -> None:
        while True:
            line = (await self._until(b"\r\n"))[:-2].split(b";", 1)[0].strip()
            if not _CHUNK_SIZE.match(line):
                raise ConnectionResetError(f"the answer of {self.name} is badly chunked")
            size = int(line, 16)
            if size == 0:
                break
            while size:
                if not self.buf and not await self._more():
                    raise ConnectionResetError(f"the answer of {self.name} is cut")
                piece, self.buf = self.buf[:size], self.buf[size:]
                size -= len(piece)
                await self._chunk(self.redactor.feed(piece))
            if await self._until(b"\r\n") != b"\r\n":
                raise ConnectionResetError(f"the answer of {self.name} is badly chunked")
        await self._chunk(self.redactor.end())
        trailers = b""
        while (line := await self._until(b"\r\n")) != b"\r\n":
            trailers += line
            if len(trailers) > MAX_ANSWER_HEAD:  # as an answer's head: bounded, whole
                raise ConnectionResetError(f"the answer of {self.name} has too many trailers")
        await self.client.sendall(b"0\r\n" + self.redactor.blank(trailers) + b"\r\n")

    async def _chunk(self, data: bytes) -> None:
        if data:
            await self.client.sendall(b"%x\r\n%s\r\n" % (len(data), data))


def _answer_head(head: bytes) -> tuple[int, dict[bytes, list[bytes]]]:
    """An answer head's status and its fields' comma-separated values (lower case)."""
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ConnectionResetError("the answer is not HTTP/1.x")
    fields: dict[bytes, list[bytes]] = {}
    for line in lines[1:]:
        field, _, value = line.partition(b":")
        fields.setdefault(field.strip().lower(), []).extend(
            v.strip().lower() for v in value.split(b",") if v.strip())
    return int(parts[1]), fields


async def _pump_blanked(src: TlsStream, dst: TlsStream, redactor: Redactor) -> None:
    while True:
        data = await asyncio.wait_for(src.recv(), IDLE_TIMEOUT)
        if not data:
            if tail := redactor.end():
                await dst.sendall(tail)
            await dst.close_write()
            return
        if data := redactor.feed(data):
            await dst.sendall(data)


async def _relay(client: TlsStream, server: TlsStream, answer: _Answer) -> None:
    pumps = [asyncio.ensure_future(_pump(client, server)),
             asyncio.ensure_future(answer.run())]
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
