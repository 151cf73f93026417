"""The guest's terminal operations (stdlib only).

``pty_create`` starts a program on a new pseudo-terminal and ``pty_attach`` joins one
by pid (its recent output first); both then stream the terminal's output as
``{"stream": "pty"}`` frames while taking, on the same connection, frames the client
sends: a payload is typed into the terminal, ``{"resize": [cols, rows]}`` resizes it.
The stream ends with ``{"done": true, "exit_code": N}`` when the program has ended; a
client that disconnects only detaches: the terminal keeps running for the next one.
``pty_kill`` signals one, ``pty_list`` lists them.
"""

from __future__ import annotations

import os
import threading
from collections import deque

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Deque, Dict, List

    Req = Dict[str, Any]

if __package__:
    from . import checks, ops, users, workers
    from . import protocol as proto
    from .conn import Conn
    from .errors import GuestError, bad
    from .limits import PTY_FINISHED_KEPT, PTY_LIVE_CAP
    from .proc_table import ProcTable
    from .pty_proc import PtyProc, Viewer
else:  # imported by agent.py from the guest's directory
    import checks  # type: ignore[no-redef]
    import ops  # type: ignore[no-redef]
    import protocol as proto  # type: ignore[no-redef]
    import users  # type: ignore[no-redef]
    import workers  # type: ignore[no-redef]
    from conn import Conn  # type: ignore[no-redef]
    from errors import GuestError, bad  # type: ignore[no-redef]
    from limits import PTY_FINISHED_KEPT, PTY_LIVE_CAP  # type: ignore[no-redef]
    from proc_table import ProcTable  # type: ignore[no-redef]
    from pty_proc import PtyProc, Viewer  # type: ignore[no-redef]

MAX_SIZE = 9999  # columns or rows


def default_shell(env: Dict[str, str]) -> List[str]:
    """A login shell: $SHELL if it is a program here, else bash, else sh."""
    for shell in (env.get("SHELL", ""), "/bin/bash", "/bin/sh"):
        if shell.startswith("/") and os.access(shell, os.X_OK):
            return [shell, "-l"]
    raise GuestError("not_found", "no shell in this sandbox (/bin/sh is missing): "
                     "give the program to run")


def _size(req: Req) -> List[int]:
    return [int(checks.integer(req, key, default, 1, MAX_SIZE) or default)
            for key, default in (("cols", 80), ("rows", 24))]


class PtyOps:
    """The terminals of one sandbox (their children are reaped by ``table``)."""

    def __init__(self, table: ProcTable) -> None:
        self.table = table
        self.lock = threading.Lock()
        self.ptys: Dict[int, PtyProc] = {}
        self.ended: Deque[PtyProc] = deque()

    def handlers(self) -> Dict[str, Callable[[Conn, Req], None]]:
        return {ops.PTY_CREATE: self.op_create, ops.PTY_ATTACH: self.op_attach,
                ops.PTY_KILL: self.op_kill, ops.PTY_LIST: self.op_list}

    def get(self, pid: int) -> PtyProc:
        with self.lock:
            pty = self.ptys.get(pid)
        if pty is None:
            raise GuestError("not_found", f"no terminal with pid {pid} (it was never "
                                          "started, or it ended long ago)")
        return pty

    def _ended(self, pty: PtyProc) -> None:
        with self.lock:
            if self.ptys.get(pty.pid) is not pty:
                return
            self.ended.append(pty)
            while len(self.ended) > PTY_FINISHED_KEPT:
                old = self.ended.popleft()
                if self.ptys.get(old.pid) is old:
                    del self.ptys[old.pid]

    def op_create(self, conn: Conn, req: Req) -> None:
        env = dict(checks.env(req.get("env")))
        env.setdefault("TERM", "xterm-256color")
        argv = checks.str_list(req["argv"], "argv") if req.get("argv") is not None \
            else default_shell(env)
        name = users.check_name(req.get("user"))
        account = users.lookup(name) if name is not None else None
        env = users.login_env(env, account)
        cwd = checks.path({"cwd": req.get("cwd") or (account.home if account else "/")}, "cwd")
        cols, rows = _size(req)
        if not os.path.isdir(cwd):
            raise GuestError("not_found", f"working directory {cwd} does not exist")

        def start() -> PtyProc:  # under the process table's lock
            with self.lock:
                live = sum(1 for p in self.ptys.values() if not p.finished)
                if live >= PTY_LIVE_CAP:
                    raise GuestError("resource_exhausted", f"{live} terminals are open in "
                                     f"this sandbox (at most {PTY_LIVE_CAP}); end one first")
                try:
                    pty = PtyProc(argv, cwd, env, cols, rows, self.table.child_limit,
                                  self._ended, account)
                except FileNotFoundError:
                    raise GuestError("not_found", f"cannot execute {argv[0]!r}: no such "
                                     f"program (PATH={env.get('PATH', '')})") from None
                except OSError as exc:
                    raise bad(f"cannot execute {argv[0]!r}: {exc.strerror or exc}") from None
                old = self.ptys.pop(pty.pid, None)
                if old is not None and old in self.ended:
                    self.ended.remove(old)  # pid reused
                self.ptys[pty.pid] = pty
                return pty

        pty = self.table.adopt(start)
        viewer = pty.attach(replay=False)
        workers.start(pty.pump)
        self._stream(conn, pty, viewer, {"started": True, "pid": pty.pid})

    def op_attach(self, conn: Conn, req: Req) -> None:
        pty = self.get(checks.pid(req))
        self._stream(conn, pty, pty.attach(replay=True),
                     {"started": True, "pid": pty.pid, "running": not pty.finished})

    def op_kill(self, conn: Conn, req: Req) -> None:
        pty = self.get(checks.pid(req))
        sig = int(checks.integer(req, "signal", 9, 1, 64) or 9)
        conn.done(killed=pty.signal(sig))

    def op_list(self, conn: Conn, req: Req) -> None:
        with self.lock:
            ptys = sorted(self.ptys.values(), key=lambda p: p.started_at)
        conn.done(terminals=[p.info() for p in ptys])

    def _stream(self, conn: Conn, pty: PtyProc, viewer: Viewer, first: Dict[str, Any]) -> None:
        """Output to the client until the program ends or the client leaves; what the
        client sends meanwhile goes to the terminal."""
        try:
            conn.sock.settimeout(None)  # an idle terminal is no stalled request
            conn.send(first)
            conn.reader = workers.start(_take_input, conn, pty, viewer)
            while True:
                with pty.cond:
                    while not (viewer.chunks or pty.finished or viewer.cancelled):
                        pty.cond.wait()
                    data = viewer.take()
                    finished, cancelled = pty.finished, viewer.cancelled
                    pty.cond.notify_all()  # a pump waiting for us to catch up
                for start in range(0, len(data), proto.CHUNK):
                    conn.send({"stream": "pty"}, data[start:start + proto.CHUNK])
                if cancelled:
                    return  # detached: the terminal goes on
                if finished:
                    conn.done(pid=pty.pid, exit_code=pty.exit_code, dropped=viewer.dropped)
                    return
        finally:
            pty.detach(viewer)


def _take_input(conn: Conn, pty: PtyProc, viewer: Viewer) -> None:
    """The client's frames: keystrokes and resizes, until it leaves (or the end)."""
    try:
        while True:
            frame = proto.read_frame(conn.rfile)
            if frame is None:
                break
            obj, payload = frame
            if payload:
                with pty.input_lock:
                    pty.write(payload)
            size = obj.get("resize")
            if size is not None:
                if not (isinstance(size, list) and len(size) == 2):
                    break  # a client that sends nonsense is cut off
                try:
                    cols, rows = _size({"cols": size[0], "rows": size[1]})
                except GuestError:
                    break
                pty.resize(cols, rows)
    except (OSError, proto.ProtocolError):
        pass
    pty.cancel(viewer)
