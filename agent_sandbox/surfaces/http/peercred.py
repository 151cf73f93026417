"""Who is on the other end of a unix socket: ``SO_PEERCRED`` into the ASGI scope.

uvicorn does not hand the socket to the application, so the daemon runs uvicorn with
``PeerCredProtocol``: uvicorn's own HTTP protocol class, which reads the peer's pid, uid,
gid (``SO_PEERCRED``) and supplementary groups (``SO_PEERGROUPS``) once per connection,
as the kernel recorded them at ``connect()``, and puts them in the per-connection copy of
the lifespan state that uvicorn gives every request as ``scope["state"]``. Nothing a
client sends can put them there; a TCP server never does.

``PeerGuard`` then refuses (403) every request from a peer that is neither root, the
daemon's own user, nor a member of the daemon's group - even when the socket's mode would
have let it connect (defense in depth: a ``chmod 666`` by mistake opens nothing).
"""

from __future__ import annotations

import errno
import grp
import json
import os
import pwd
import socket
import struct
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from agent_sandbox.core.errors import PermissionDeniedError

PEER_STATE_KEY = "abx.peer"
_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13
_UCRED = struct.Struct("3i")

__all__ = ["PEER_STATE_KEY", "PeerCred", "PeerCredProtocol", "PeerGuard",
           "peer_credentials", "peer_of"]


@dataclass(frozen=True)
class PeerCred:
    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...]

    @property
    def user(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return f"uid {self.uid}"

    def in_group(self, gid: int) -> bool:
        return self.gid == gid or gid in self.groups


def _peer_groups(sock: Any, uid: int, gid: int) -> tuple[int, ...]:
    size = 256
    while size <= 65536:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, 4 * size)
        except OSError as exc:
            if exc.errno == errno.ERANGE:
                size *= 16
                continue
            break  # an old kernel: fall back to the group database
        return tuple(struct.unpack(f"{len(raw) // 4}I", raw))
    try:
        return tuple(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    except KeyError:
        return (gid,)


def peer_credentials(sock: Any) -> PeerCred:
    """The credentials the kernel recorded for the process that connected ``sock``."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  _UCRED.size))
    return PeerCred(pid=pid, uid=uid, gid=gid, groups=_peer_groups(sock, uid, gid))


class PeerCredProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's HTTP protocol, plus the peer's credentials in every request's state."""

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        peer: PeerCred | None = None
        if sock is not None and sock.family == socket.AF_UNIX:
            try:
                peer = peer_credentials(sock)
            except OSError:
                peer = None  # PeerGuard refuses a connection it cannot identify
        # A copy per connection: uvicorn shares the dict it was given between connections.
        self.app_state = {**self.app_state, PEER_STATE_KEY: peer}
        super().connection_made(transport)


def peer_of(scope: Any) -> PeerCred | None:
    state = scope.get("state") if isinstance(scope, dict) else None
    if not isinstance(state, dict):
        return None
    peer = state.get(PEER_STATE_KEY)
    return peer if isinstance(peer, PeerCred) else None


def group_gid(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


class PeerGuard:
    """ASGI middleware for the unix socket: only root, the daemon's own user and members
    of ``group`` get through; everyone else gets a 403 ``permission_denied``."""

    def __init__(self, app: Any, group: str) -> None:
        self.app = app
        self.group = group
        self.gid = group_gid(group)
        self.own_uid = os.geteuid()

    def allowed(self, peer: PeerCred | None) -> bool:
        if peer is None:
            return False
        if peer.uid in (0, self.own_uid):
            return True
        return self.gid is not None and peer.in_group(self.gid)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        peer = peer_of(scope)
        if self.allowed(peer):
            await self.app(scope, receive, send)
            return
        if peer is None:
            who = "an unidentified peer"
        elif peer.user.startswith("uid "):
            who = peer.user
        else:
            who = f"user {peer.user} (uid {peer.uid})"
        message = (f"{who} may not use this abx daemon: only root and members of group "
                   f"{self.group!r} may (an administrator can run "
                   f"`usermod -aG {self.group} <user>`; the user then logs in again)")
        body = json.dumps({"code": PermissionDeniedError.code, "message": message,
                           "details": {"group": self.group}}).encode()
        prefix = "http"
        if scope["type"] == "websocket":  # a terminal: the same answer, to its handshake
            if "websocket.http.response" not in scope.get("extensions", {}):
                await send({"type": "websocket.close", "code": 1008})
                return
            prefix = "websocket.http"
        await send({"type": f"{prefix}.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": f"{prefix}.response.body", "body": body})
