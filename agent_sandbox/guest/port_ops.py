"""The guest's ``port_connect`` operation: a TCP connection to a server listening inside
the sandbox, relayed raw over this guest connection (stdlib only).

Request: ``{"op": "port_connect", "port": N}``. Reply: ``{"connected": true}`` once
127.0.0.1:N (else [::1]:N) accepted, or an error frame. After the reply the connection
carries the TCP stream's bytes both ways, unframed, until either side closes. The network
namespace is the sandbox's own: this reaches only what listens inside, with no egress.
"""

from __future__ import annotations

import selectors
import socket

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Dict

    Req = Dict[str, Any]

if __package__:
    from . import ops
    from .conn import Conn
    from .errors import GuestError, bad
else:  # imported by agent.py from the guest's directory
    import ops  # type: ignore[no-redef]
    from conn import Conn  # type: ignore[no-redef]
    from errors import GuestError, bad  # type: ignore[no-redef]

_CHUNK = 256 * 1024
_CONNECT_TIMEOUT = 10.0


def _connect(port: int) -> socket.socket:
    last: OSError = OSError("nothing tried")
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(_CONNECT_TIMEOUT)
        try:
            sock.connect((host, port))
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise GuestError("not_found", f"nothing accepts connections on port {port} inside the "
                                    f"sandbox ({last.strerror or last}); start a server "
                                    "listening on 127.0.0.1 or 0.0.0.0 there")


def op_port_connect(conn: Conn, req: Req) -> None:
    port = req.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise bad("port must be an integer from 1 to 65535")
    tcp = _connect(port)
    try:
        conn.send({"connected": True})
        _relay(conn.sock, tcp)
    finally:
        tcp.close()


def _relay(host: socket.socket, tcp: socket.socket) -> None:
    """Both ways until both have ended; a blocked writer stalls only this connection."""
    for sock in (host, tcp):
        sock.settimeout(None)
    peer = {host: tcp, tcp: host}
    open_reads = {host, tcp}
    with selectors.DefaultSelector() as sel:
        for sock in open_reads:
            sel.register(sock, selectors.EVENT_READ)
        while open_reads:
            for key, _ in sel.select():
                src = key.fileobj
                try:
                    data = src.recv(_CHUNK)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                dst = peer[src]  # type: ignore[index]
                if data:
                    try:
                        dst.sendall(data)
                        continue
                    except OSError:
                        return
                sel.unregister(src)
                open_reads.discard(src)  # type: ignore[arg-type]
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    return


HANDLERS: Dict[str, Callable[[Conn, Req], None]] = {ops.PORT_CONNECT: op_port_connect}
