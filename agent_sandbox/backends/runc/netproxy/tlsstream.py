"""TLS on the proxy's raw non-blocking sockets (ssl.SSLObject over memory BIOs): the
sandbox's side of a secret host's connection, which the proxy terminates with the
sandbox's own CA, and the re-originated connection to the real host, verified as usual.
The bytes already read while peeking (the ClientHello) are fed in first."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl

CHUNK = 64 * 1024


class TlsStream:
    def __init__(self, sock: socket.socket, context: ssl.SSLContext, *, server_side: bool,
                 server_hostname: str | None = None, first: bytes = b"") -> None:
        self.sock = sock
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self._in, self._out, server_side=server_side,
                                    server_hostname=server_hostname)
        if first:
            self._in.write(first)
        self._loop = asyncio.get_running_loop()
        self._sending = asyncio.Lock()  # records leave in the order they were made
        self._filling = asyncio.Lock()

    async def _flush(self) -> None:
        async with self._sending:
            data = self._out.read()
            if data:
                await self._loop.sock_sendall(self.sock, data)

    async def _fill(self) -> None:
        async with self._filling:
            chunk = await self._loop.sock_recv(self.sock, CHUNK)
            if chunk:
                self._in.write(chunk)
            else:
                self._in.write_eof()

    async def _call(self, fn, *args):  # noqa: ANN001, ANN202 - an SSLObject method
        while True:
            try:
                result = fn(*args)
            except ssl.SSLWantReadError:
                await self._flush()
                if self._in.eof:
                    raise ConnectionResetError("the peer closed during TLS") from None
                await self._fill()
                continue
            await self._flush()
            return result

    async def handshake(self) -> None:
        await self._call(self.tls.do_handshake)

    async def recv(self) -> bytes:
        """Up to CHUNK bytes; b"" at the end (a close, also an unclean one)."""
        try:
            return await self._call(self.tls.read, CHUNK)
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return b""

    async def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = await self._call(self.tls.write, view)
            view = view[n:]

    async def close_write(self) -> None:
        """A TLS close_notify, then the socket's write side closed."""
        with contextlib.suppress(ssl.SSLError, OSError):
            self.tls.unwrap()
        with contextlib.suppress(ssl.SSLError, OSError):
            await self._flush()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)


def server_context(cert_pem: str, key_pem: str) -> ssl.SSLContext:
    """What the proxy shows the sandbox for a secret host: HTTP/1.1 only (ALPN), so every
    request is one the proxy can read. The PEMs go through a memfd (ssl loads chains only
    from files; nothing is written to any file system)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    fd = os.memfd_create("abx-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, (cert_pem + "\n" + key_pem).encode())
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return ctx


def client_context(extra_ca: str = "") -> ssl.SSLContext:
    """To the real host: the host's trust store (and the operator's extra CAs), names
    checked, HTTP/1.1."""
    ctx = ssl.create_default_context()
    if extra_ca:
        ctx.load_verify_locations(cadata=extra_ca)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx
