"""Moving bytes between a sandbox's connection and its upstream, on raw non-blocking
sockets: each direction reads into one reused buffer and writes it out before reading
again (backpressure: a slow reader stalls its writer, nothing piles up in the proxy), an
end of stream is passed on as a half-close, an error on either side resets both, and a
relay idle too long is closed. Twice the throughput of asyncio streams at half the CPU
(bench: tests/runtime/test_netproxy_process.py prints it)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

CHUNK = 64 * 1024  # per direction: at most MAX_RELAYS * 2 * CHUNK held (tcp.py)
IDLE_TIMEOUT = 900.0  # neither side said anything for this long: closed
HALF_CLOSED_IDLE = 60.0  # one side has finished and the other is silent this long: closed
_LINGER_RESET = struct.pack("ii", 1, 0)


def reset(sock: socket.socket) -> None:
    """Close with a TCP reset: the peer's next read or write fails at once."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    sock.close()


def send_and_close(sock: socket.socket, data: bytes) -> None:
    """Best effort: a short answer (fits the socket buffer), then a normal close. What the
    client sent and nobody read is drained first (bounded), else the kernel would answer
    the close with a reset that can destroy the answer before the client reads it."""
    with contextlib.suppress(OSError):
        sock.send(data)
        sock.shutdown(socket.SHUT_WR)
        for _ in range(16):
            if not sock.recv(CHUNK):
                break
    sock.close()


class _Activity:
    __slots__ = ("last",)

    def __init__(self, now: float) -> None:
        self.last = now


async def _pump(loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket,
                seen: _Activity) -> bool:
    """``src`` to ``dst`` until ``src`` ends (True: a clean end, passed on as a
    half-close) or either side fails (False)."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    try:
        while n := await loop.sock_recv_into(src, buf):
            seen.last = loop.time()
            await loop.sock_sendall(dst, view[:n])
        dst.shutdown(socket.SHUT_WR)
        return True
    except OSError:
        return False


async def relay(client: socket.socket, upstream: socket.socket) -> None:
    """Both ways until both ends finish, one fails, or the relay goes idle; then both
    sockets are closed (reset if anything failed or timed out)."""
    loop = asyncio.get_running_loop()
    seen = _Activity(loop.time())
    pumps = [asyncio.ensure_future(_pump(loop, client, upstream, seen)),
             asyncio.ensure_future(_pump(loop, upstream, client, seen))]
    active, clean = set(pumps), False
    try:
        while True:
            done, active = await asyncio.wait(active, timeout=30.0,
                                              return_when=asyncio.FIRST_COMPLETED)
            if any(not task.result() for task in done):
                break  # a failure on one side: the other is reset, not left hanging
            if not active:
                clean = True
                break
            limit = HALF_CLOSED_IDLE if len(active) == 1 else IDLE_TIMEOUT
            if loop.time() - seen.last > limit:
                break
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for sock in (client, upstream):
            if clean:
                sock.close()
            else:
                reset(sock)
