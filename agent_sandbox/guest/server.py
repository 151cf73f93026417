"""The guest's server: listening sockets, one thread per connection, and each
connection's request (authenticated when a token is set) dispatched to its operation
(stdlib only). One request per connection; see ``protocol.py`` for the framing."""

from __future__ import annotations

import os
import socket
import stat
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Dict, Optional, Set

    Req = Dict[str, Any]

if __package__:
    from . import file_ops, locks, ops
    from . import protocol as proto
    from .conn import Conn
    from .errors import GuestError, bad, os_error
    from .limits import REQUEST_TIMEOUT
    from .proc_table import ProcTable
    from .process_ops import ProcessOps
else:  # imported by agent.py from the guest's directory
    import file_ops  # type: ignore[no-redef]
    import locks  # type: ignore[no-redef]
    import ops  # type: ignore[no-redef]
    import protocol as proto  # type: ignore[no-redef]
    from conn import Conn  # type: ignore[no-redef]
    from errors import GuestError, bad, os_error  # type: ignore[no-redef]
    from limits import REQUEST_TIMEOUT  # type: ignore[no-redef]
    from proc_table import ProcTable  # type: ignore[no-redef]
    from process_ops import ProcessOps  # type: ignore[no-redef]

# Every cold create waits for what pid 1 imports before its first answer: the operations a
# new sandbox's first command does not need are imported on their first use (a few ms,
# once; not in a warm-up thread, which would slow that first command). Only from a
# read-only guest directory (``agent.main``): a late import must not find code the sandbox
# wrote. Module -> its operations.
LATER = {
    "pty_ops": (ops.PTY_CREATE, ops.PTY_ATTACH, ops.PTY_KILL, ops.PTY_LIST),
    "watch_ops": (ops.WATCH,),
    "dir_ops": (ops.TAR_OUT, ops.TAR_IN),
    "port_ops": (ops.PORT_CONNECT,),
}
_LATER_BY_OP = {op: module for module, names in LATER.items() for op in names}
# What the guest imports inside its functions, guest modules and stdlib ones: all of it
# before any sandbox code runs when the guest's code or python may be written by the
# sandbox (a Pod's image layer), which then imports nothing more (``agent.new_agent``).
LATE_MODULES = ("dir_unpack", "watch_inotify", "watch_poll")
LATE_STDLIB = ("errno", "fcntl", "functools", "hmac", "resource", "shutil", "stat",
               "subprocess", "tarfile", "termios")


def _guest_module(name: str) -> Any:
    if __package__:
        return getattr(__import__(__package__, fromlist=[name]), name)
    return __import__(name)


class Agent:
    """The guest's state (its process table) and its operations by name."""

    def __init__(self, token: Optional[str]) -> None:
        self.token = token
        self.table = ProcTable()
        # Every client connection open now (the host's: none may be left at a checkpoint).
        self.live: Set[socket.socket] = set()
        self.live_lock = threading.Lock()
        self.srv: Optional[socket.socket] = None
        self.parking = threading.Event()
        self.parkable = False  # only a listener the host handed over (--listen-fd)
        self.ops: Dict[str, Callable[[Conn, Req], None]] = {
            ops.PING: self.op_ping,
            ops.PARK: self.op_park,
            **ProcessOps(self.table).handlers(),
            **file_ops.HANDLERS,
            **locks.HANDLERS,
        }
        self._loading = threading.Lock()
        self._warm_once = threading.Lock()
        self._warmed = False

    def handler(self, op: str) -> Optional[Callable[[Conn, Req], None]]:
        found = self.ops.get(op)
        module = _LATER_BY_OP.get(op)
        if found is None and module is not None:
            self._load(module)
            found = self.ops.get(op)
        return found

    def preload(self) -> None:
        """Every later operation now, before any sandbox code runs (a guest directory the
        sandbox could write, as a Pod image's layer is)."""
        for name in LATER:
            self._load(name)
        for name in LATE_MODULES:
            _guest_module(name)
        for name in LATE_STDLIB:
            __import__(name)

    def _load(self, name: str) -> None:
        with self._loading:  # once: a module's operations may hold state (the terminals)
            if LATER[name][0] in self.ops:
                return
            module = _guest_module(name)
            if name == "pty_ops":
                self.ops.update(module.PtyOps(self.table).handlers())
            else:
                self.ops.update(module.HANDLERS)

    # -- dispatch
    def handle(self, sock: socket.socket) -> None:
        with self.live_lock:
            self.live.add(sock)
        try:
            self._handle(sock)
        finally:
            with self.live_lock:
                self.live.discard(sock)

    def _handle(self, sock: socket.socket) -> None:
        conn = Conn(sock)
        op: Any = None
        try:
            sock.settimeout(REQUEST_TIMEOUT)
            req = self._request(conn)
            if req is not None:
                op = req.get("op")
                handler = self.handler(op) if isinstance(op, str) else None
                if handler is None:
                    known = ", ".join(sorted({*self.ops, *_LATER_BY_OP}))
                    raise bad(f"unknown op {op!r}; known ops: {known}")
                handler(conn, req)
        except GuestError as exc:
            self._send_error(conn, exc.code, exc.message, exc.details)
        except proto.ProtocolError as exc:
            self._send_error(conn, "invalid_argument", f"protocol error: {exc}")
        except OSError as exc:
            if not conn.lost:  # the handler's own (a file's): answered, never a dropped call
                sys.stderr.write(f"abx-guest: unmapped OS error in {op!r}: {exc!r}\n")
                where = exc.filename if isinstance(exc.filename, str) else f"op {op!r}"
                err = os_error(exc, where)
                self._send_error(conn, err.code, err.message)
        except Exception as exc:  # a bug: report it instead of dropping the connection
            sys.stderr.write(f"abx-guest: internal error: {exc!r}\n")
            self._send_error(conn, "internal", f"guest agent error: {exc!r}")
        finally:
            conn.close()

    def _send_error(self, conn: Conn, code: str, message: str,
                    details: Optional[Dict[str, Any]] = None) -> None:
        error: Dict[str, Any] = {"code": code, "message": message}
        if details:
            error["details"] = details
        try:
            conn.done(error=error)
        except (OSError, proto.ProtocolError):
            pass

    def _request(self, conn: Conn) -> Optional[Req]:
        frame = conn.read()
        if frame is None:
            return None
        req = frame[0]
        if req.get("op") == ops.HELLO:
            self._check_token(req.get("token"))
            frame = conn.read()
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

    def op_park(self, conn: Conn, req: Req) -> None:
        """Before a checkpoint: every host connection and the listener are of the host's
        network namespace, which a checkpoint cannot hold. Answer, then let the serving
        thread close them all (``park``)."""
        if not self.parkable:
            raise bad("this guest cannot park: its listener is not one the host handed over")
        conn.done(parked=True)
        self.parking.set()
        srv = self.srv
        if srv is not None:
            try:
                srv.shutdown(socket.SHUT_RDWR)  # wakes accept() in serve()
            except OSError:
                pass

    def op_ping(self, conn: Conn, req: Req) -> None:
        conn.done(pid=os.getpid(), version=proto.VERSION, python="%d.%d.%d" % sys.version_info[:3])
        with self._warm_once:
            warm, self._warmed = not self._warmed, True
        if warm:  # after the first answer: every command needs it, the answer does not
            threading.Thread(target=__import__, args=("subprocess",), daemon=True).start()


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


def set_dumpable(on: bool) -> None:
    """Whether processes of the sandbox (without CAP_SYS_PTRACE) may ptrace the guest,
    or take its memory and fds; the guest is not, except while parked (``park``)."""
    import ctypes

    pr_set_dumpable = 4
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, int(on), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no libc to call (exotic template): seccomp still guards pid 1


_PARK_DRAIN = 0.5  # seconds for the open connections to close by themselves
_PARK_POLL = 0.002  # how often a parked guest looks for its new listener


def park(agent: Agent, srv: socket.socket) -> socket.socket:
    """Close every connection, put a placeholder where the listener was (the host names
    it to the restore, which puts a new listener in its place), and wait for it.

    The guest is checkpointed meanwhile: this thread wakes in the restored sandbox
    (or never, when the checkpointed one is stopped)."""
    with agent.live_lock:
        for sock in agent.live:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    deadline = time.monotonic() + _PARK_DRAIN
    while time.monotonic() < deadline:
        with agent.live_lock:
            if not agent.live:
                break
        time.sleep(0.001)
    # A thread that does not read its connection (one following a silent process) has
    # not closed it: its descriptor becomes /dev/null, whose next send fails and ends it.
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    with agent.live_lock:
        for sock in agent.live:
            try:
                os.dup2(null, sock.fileno(), inheritable=False)
            except OSError:
                pass  # closed meanwhile
    os.close(null)
    # CRIU checks the guest's namespaces from inside the sandbox's user namespace, which
    # a non-dumpable guest refuses once a restore has made its memory (not an exec in
    # the sandbox): dumpable while parked, where it holds nothing of the host's.
    set_dumpable(True)
    fd = srv.detach()
    # The listener closes: its fd is a socket of this sandbox's own now, unbound, which the
    # restore replaces with the new listener (CRIU's inherit-fd, keyed by its inode).
    placeholder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    os.dup2(placeholder.fileno(), fd, inheritable=False)
    placeholder.close()
    while True:
        time.sleep(_PARK_POLL)
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                new = socket.socket(fileno=fd)
                if new.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    set_dumpable(False)
                    agent.parking.clear()
                    return new
                new.detach()
        except OSError:
            pass


def serve(agent: Agent, srv: socket.socket, tcp: bool) -> None:
    agent.srv = srv
    while True:
        try:
            sock, _ = srv.accept()
        except OSError:  # EMFILE and friends: back off instead of spinning
            if agent.parking.is_set():
                srv = agent.srv = park(agent, srv)
                continue
            time.sleep(0.05)
            continue
        if tcp:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        threading.Thread(target=agent.handle, args=(sock,), daemon=True).start()
