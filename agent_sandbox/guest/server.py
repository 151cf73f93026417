"""The guest's server: listening sockets, one thread per connection, and each
connection's request (authenticated when a token is set) dispatched to its operation
(stdlib only). One request per connection; see ``protocol.py`` for the framing."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Dict, Optional

    Req = Dict[str, Any]

if __package__:
    from . import dir_ops, file_ops, port_ops, watch_ops
    from . import protocol as proto
    from .conn import Conn
    from .errors import GuestError, bad
    from .limits import REQUEST_TIMEOUT
    from .proc_table import ProcTable
    from .process_ops import ProcessOps
    from .pty_ops import PtyOps
else:  # imported by agent.py from the guest's directory
    import dir_ops  # type: ignore[no-redef]
    import file_ops  # type: ignore[no-redef]
    import port_ops  # type: ignore[no-redef]
    import protocol as proto  # type: ignore[no-redef]
    import watch_ops  # type: ignore[no-redef]
    from conn import Conn  # type: ignore[no-redef]
    from errors import GuestError, bad  # type: ignore[no-redef]
    from limits import REQUEST_TIMEOUT  # type: ignore[no-redef]
    from proc_table import ProcTable  # type: ignore[no-redef]
    from process_ops import ProcessOps  # type: ignore[no-redef]
    from pty_ops import PtyOps  # type: ignore[no-redef]


class Agent:
    """The guest's state (its process table) and its operations by name."""

    def __init__(self, token: Optional[str]) -> None:
        self.token = token
        self.table = ProcTable()
        self.ops: Dict[str, Callable[[Conn, Req], None]] = {
            "ping": self.op_ping,
            **ProcessOps(self.table).handlers(),
            **PtyOps(self.table).handlers(),
            **file_ops.HANDLERS,
            **watch_ops.HANDLERS,
            **dir_ops.HANDLERS,
            **port_ops.HANDLERS,
        }

    # -- dispatch
    def handle(self, sock: socket.socket) -> None:
        conn = Conn(sock)
        try:
            sock.settimeout(REQUEST_TIMEOUT)
            req = self._request(conn)
            if req is not None:
                op = req.get("op")
                handler = self.ops.get(op) if isinstance(op, str) else None
                if handler is None:
                    raise bad(f"unknown op {op!r}; known ops: {', '.join(sorted(self.ops))}")
                handler(conn, req)
        except GuestError as exc:
            self._send_error(conn, exc.code, exc.message)
        except proto.ProtocolError as exc:
            self._send_error(conn, "invalid_argument", f"protocol error: {exc}")
        except OSError:
            pass  # client went away or timed out; nothing to tell it
        except Exception as exc:  # a bug: report it instead of dropping the connection
            sys.stderr.write(f"abx-guest: internal error: {exc!r}\n")
            self._send_error(conn, "internal", f"guest agent error: {exc!r}")
        finally:
            conn.close()

    def _send_error(self, conn: Conn, code: str, message: str) -> None:
        try:
            conn.done(error={"code": code, "message": message})
        except (OSError, proto.ProtocolError):
            pass

    def _request(self, conn: Conn) -> Optional[Req]:
        frame = proto.read_frame(conn.rfile)
        if frame is None:
            return None
        req = frame[0]
        if req.get("op") == "hello":
            self._check_token(req.get("token"))
            frame = proto.read_frame(conn.rfile)
            if frame is None:
                return None
            req = frame[0]
        elif self.token is not None:
            raise bad("authentication required: send {'op': 'hello', 'token': ...} first")
        return req

    def _check_token(self, given: Any) -> None:
        if self.token is None:
            return
        import hmac

        if not isinstance(given, str) or not hmac.compare_digest(
            given.encode("utf-8"), self.token.encode("utf-8")
        ):
            raise bad("authentication failed: wrong guest token")

    def op_ping(self, conn: Conn, req: Req) -> None:
        conn.done(pid=os.getpid(), version=proto.VERSION, python="%d.%d.%d" % sys.version_info[:3])


def listen_unix(path: str) -> socket.socket:
    # Bind under a temporary name and rename into place after listen(): the socket path
    # appearing means "ready", so the host can poll for the file instead of retrying.
    tmp = f"{path}.{os.getpid()}.tmp"
    for stale in (tmp, path):
        try:
            os.unlink(stale)
        except FileNotFoundError:
            pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(tmp)
    os.chmod(tmp, 0o600)
    srv.listen(128)
    os.rename(tmp, path)
    return srv


def listen_tcp(spec: str) -> socket.socket:
    host, _, port = spec.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(128)
    return srv


def listen_fd(spec: str) -> socket.socket:
    # A listener the host bound in a directory of its own and handed over (runc
    # --preserve-fds): the host knows what it connects to, whatever happens in here.
    srv = socket.socket(fileno=int(spec))
    os.set_inheritable(srv.fileno(), False)
    return srv


def serve(agent: Agent, srv: socket.socket, tcp: bool) -> None:
    while True:
        try:
            sock, _ = srv.accept()
        except OSError:  # EMFILE and friends: back off instead of spinning
            time.sleep(0.05)
            continue
        if tcp:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        threading.Thread(target=agent.handle, args=(sock,), daemon=True).start()
