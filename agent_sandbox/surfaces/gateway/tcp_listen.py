"""The gateway's TCP socket, bound before anything says "serving": a busy port, a port
that needs privileges or an address this host does not have is one clear error."""

from __future__ import annotations

import errno
import os
import socket

from agent_sandbox.core.errors import InvalidArgumentError, RuntimeUnavailableError


def bind_tcp(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening socket on ``host:port`` (IPv4 or IPv6, as the address resolves)."""
    if not 0 < port < 65536:
        raise InvalidArgumentError(f"--port must be 1-65535, got {port}")
    bare = host.strip("[]")
    try:
        infos = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise InvalidArgumentError(f"cannot listen on {host}: {exc.strerror} (give an "
                                   "address of this host, such as 127.0.0.1 or 0.0.0.0)"
                                   ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise _bind_error(host, port, exc) from None
    sock.set_inheritable(True)
    return sock


def _bind_error(host: str, port: int, exc: OSError) -> Exception:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return RuntimeUnavailableError(
            f"port {port} on {host} is already in use (another `abx serve`, or another "
            f"program: `ss -ltnp 'sport = :{port}'` shows which); stop it or pick another "
            "port with --port")
    if exc.errno == errno.EACCES:
        return RuntimeUnavailableError(
            f"not allowed to listen on {where} (ports below 1024 need root or "
            f"CAP_NET_BIND_SERVICE; uid {os.geteuid()}); use --port 8080, say")
    if exc.errno == errno.EADDRNOTAVAIL:
        return InvalidArgumentError(f"{host} is not an address of this host; use 127.0.0.1 "
                                    "(this host only) or 0.0.0.0 (every interface)")
    return RuntimeUnavailableError(f"cannot listen on {where}: {exc.strerror or exc}")
