"""The guest's process operations: exec (streaming), output, wait, kill, stdin, ps,
and the rootless pause (freeze/thaw) (stdlib only)."""

from __future__ import annotations

import os
import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Dict, List, Optional, Tuple

    Req = Dict[str, Any]

if __package__:
    from . import checks, ops, users, workers
    from . import protocol as proto
    from .conn import Conn
    from .errors import GuestError
    from .limits import KILL_GRACE, MAX_OUTPUT_CAP, STREAM_TIMEOUT
    from .proc import Proc, Subscriber
    from .proc_table import ProcTable
else:  # imported by agent.py from the guest's directory
    import checks  # type: ignore[no-redef]
    import ops  # type: ignore[no-redef]
    import protocol as proto  # type: ignore[no-redef]
    import users  # type: ignore[no-redef]
    import workers  # type: ignore[no-redef]
    from conn import Conn  # type: ignore[no-redef]
    from errors import GuestError  # type: ignore[no-redef]
    from limits import KILL_GRACE, MAX_OUTPUT_CAP, STREAM_TIMEOUT  # type: ignore[no-redef]
    from proc import Proc, Subscriber  # type: ignore[no-redef]
    from proc_table import ProcTable  # type: ignore[no-redef]


class ProcessOps:
    """The operations on the processes of one table."""

    def __init__(self, table: ProcTable) -> None:
        self.table = table

    def handlers(self) -> Dict[str, Callable[[Conn, Req], None]]:
        return {
            ops.EXEC: self.op_exec,
            ops.OUTPUT: self.op_output,
            ops.WAIT: self.op_wait,
            ops.KILL: self.op_kill,
            ops.STDIN: self.op_stdin,
            ops.PS: self.op_ps,
            ops.FREEZE: self.op_freeze,
            ops.THAW: self.op_thaw,
        }

    def op_freeze(self, conn: Conn, req: Req) -> None:
        if os.getpid() != 1:
            raise GuestError("wrong_state", "freeze needs the guest to be pid 1 of its sandbox")
        self.table.set_paused(True)
        conn.done(paused=True)

    def op_thaw(self, conn: Conn, req: Req) -> None:
        if os.getpid() == 1:
            self.table.set_paused(False)
        conn.done(paused=False)

    def op_exec(self, conn: Conn, req: Req) -> None:
        argv = checks.str_list(req.get("argv"), "argv")
        cwd = checks.path({"cwd": req.get("cwd") or "/"}, "cwd")
        env = checks.env(req.get("env"))
        timeout = checks.timeout(req)
        max_output = int(checks.integer(req, "max_output", 1 << 20, 0, MAX_OUTPUT_CAP) or 0)
        background = bool(req.get("background"))
        # A background process streamed from its very start (E2B's Start): it outlives the
        # client, which still gets all its output (a later wait gets only the tail).
        follow = background and bool(req.get("follow"))
        stdin = bool(req.get("stdin"))
        name = users.check_name(req.get("user"))
        account = users.lookup(name) if name is not None else None
        proc, sub = self.table.spawn(
            argv, cwd, users.login_env(env, account), max_output, stdin, background,
            subscribe=not background or follow, creds=users.popen_kwargs(account),
        )
        if (background and not follow) or sub is None:
            conn.done(pid=proc.pid)
            return
        conn.sock.settimeout(None)
        try:
            conn.send({"started": True, "pid": proc.pid})
            # Watching for the client going away costs a thread per exec; a command with
            # a deadline ends by itself, so only stdin, an open-ended run or a caller that
            # may cancel ("watch") needs it.
            if not follow and (stdin or timeout is None or req.get("watch") is True):
                conn.reader = workers.start(_watch, conn, proc, sub, stdin)
            timed_out, cancelled = _stream(conn, proc, sub, timeout, kill=True)
        except BaseException:
            if not follow:
                proc.signal(signal.SIGKILL)  # client gone mid-stream: don't leave it running
            raise
        finally:
            proc.unsubscribe(sub)
            if not follow:
                proc.release_output()
        if cancelled:
            proc.signal(signal.SIGKILL)
            return
        code = proc.exit_code if proc.finished and proc.exit_code is not None else 137
        conn.done(
            exit_code=code,
            timed_out=timed_out,
            pid=proc.pid,
            truncated=proc.truncated or sub.dropped,
        )

    def op_output(self, conn: Conn, req: Req) -> None:
        proc = self.table.get(checks.pid(req))
        with proc.cond:
            running, code = not proc.finished, proc.exit_code
        out, err = proc.snapshot()
        final = {
            "pid": proc.pid,
            "running": running,
            "exit_code": None if running else code,
            "truncated": proc.truncated,
        }
        if len(out) + len(err) <= proto.MAX_BIN:
            conn.send(dict(final, done=True, stdout_len=len(out)), out + err)
            return
        # Too big for one frame: in pieces (a tail may be up to MAX_OUTPUT_CAP).
        _send_chunks(conn, [(name, memoryview(data)[at:at + proto.CHUNK])
                            for name, data in (("stdout", out), ("stderr", err))
                            for at in range(0, len(data), proto.CHUNK)])
        conn.done(stdout_len=0, **final)

    def op_wait(self, conn: Conn, req: Req) -> None:
        proc = self.table.get(checks.pid(req))
        timeout = checks.timeout(req)
        sub = proc.subscribe(replay=True)
        conn.sock.settimeout(None)
        try:
            timed_out, _ = _stream(conn, proc, sub, timeout, kill=False)
        finally:
            proc.unsubscribe(sub)
        running = not proc.finished
        conn.done(
            pid=proc.pid,
            running=running,
            timed_out=timed_out,
            exit_code=None if running else proc.exit_code,
            truncated=proc.truncated or sub.dropped,
        )

    def op_kill(self, conn: Conn, req: Req) -> None:
        proc = self.table.get(checks.pid(req))
        sig = int(checks.integer(req, "signal", 9, 1, 64) or 9)
        conn.done(killed=proc.signal(sig))

    def op_stdin(self, conn: Conn, req: Req) -> None:
        proc = self.table.get(checks.pid(req))
        if proc.stdin_fd is None:
            raise GuestError(
                "wrong_state",
                f"process {proc.pid} has no open stdin (start it"
                " with stdin_open=True; it may have exited or closed it)",
            )
        with proc.stdin_lock:
            conn.send({"ready": True})
            conn.sock.settimeout(STREAM_TIMEOUT)
            _pipe_stdin(conn, proc, close_on_eof=False)
        conn.done()

    def op_ps(self, conn: Conn, req: Req) -> None:
        procs = sorted(self.table.list(), key=lambda p: p.started_at)
        conn.done(processes=[p.info() for p in procs])


def _watch(conn: Conn, proc: Proc, sub: Subscriber, stdin: bool) -> None:
    """Foreground exec: forward stdin frames, then notice the client disconnecting."""
    holding = False
    try:
        if stdin:
            proc.stdin_lock.acquire()
            holding = True
            _pipe_stdin(conn, proc, close_on_eof=True)
            proc.stdin_lock.release()
            holding = False
        while proto.read_frame(conn.rfile) is not None:
            pass
    except (OSError, proto.ProtocolError):
        pass
    finally:
        if holding:
            proc.close_stdin_locked()
            proc.stdin_lock.release()
    proc.cancel(sub)


def _pipe_stdin(conn: Conn, proc: Proc, close_on_eof: bool) -> None:
    """Copy data frames to the child's stdin until eof/close (caller holds stdin_lock)."""
    while True:
        obj, payload = conn.recv("stdin")
        if payload:
            proc.write_stdin(payload)
        if obj.get("close") or (obj.get("eof") and close_on_eof):
            proc.close_stdin_locked()
            return
        if obj.get("eof"):
            if proc.finished:
                proc.close_stdin_locked()
            return


def _stream(
    conn: Conn, proc: Proc, sub: Subscriber, timeout: Optional[float], kill: bool
) -> Tuple[bool, bool]:
    """Send output frames until the process finishes; returns (timed_out, cancelled)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    while True:
        with proc.cond:
            while not (sub.chunks or proc.finished or sub.cancelled):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                proc.cond.wait(left)
            chunks = sub.take()
            if chunks:
                proc.taken()
            finished, cancelled = proc.finished, sub.cancelled
        _send_chunks(conn, chunks)
        if finished or cancelled:
            return timed_out, cancelled
        if deadline is not None and time.monotonic() >= deadline:
            if not kill or timed_out:  # wait timeout, or SIGKILL did not finish it
                return True, False
            timed_out = True
            proc.signal(signal.SIGKILL)
            deadline = time.monotonic() + KILL_GRACE


def _send_chunks(conn: Conn, chunks: List[Tuple[str, bytes]]) -> None:
    # Coalesce consecutive chunks of one stream: fewer frames for chatty programs.
    pending: List[bytes] = []
    size = 0
    name = ""
    for stream, data in chunks:
        if pending and (stream != name or size + len(data) > proto.CHUNK):
            conn.send_parts({"stream": name}, pending)
            pending, size = [], 0
        name = stream
        pending.append(data)
        size += len(data)
    if pending:
        conn.send_parts({"stream": name}, pending)
