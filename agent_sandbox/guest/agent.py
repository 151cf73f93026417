"""Guest agent: PID 1 inside every sandbox, serving exec and file operations.

Run as ``python3 -I -S /.abx/guest/agent.py --listen-fd 3`` (a listener the host made),
``--unix /run/abx/guest.sock`` or
``--tcp HOST:PORT`` (token from env ``ABX_GUEST_TOKEN``). Stdlib only, Python >= 3.9,
and it imports nothing from ``agent_sandbox``: it runs on the host's python3 through a
read-only mount (or a pod image's own python3), never on the package's environment.
One request per connection; see ``protocol.py`` for the framing.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import stat
import sys
import threading
import time
from collections import deque

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, BinaryIO, Callable, Deque, Dict, List, Optional, Tuple

    Req = Dict[str, Any]

if __package__:
    from . import protocol as proto
else:  # run as a script from /.abx/guest: -I drops the script dir from sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import protocol as proto  # type: ignore[no-redef]

FINISHED_KEPT = 256
MAX_OUTPUT_CAP = 64 << 20
SUB_BACKLOG = 8 << 20  # per-subscriber undelivered bytes before oldest chunks are dropped
LIST_CAP = 10000
LIST_JSON_CAP = 6 << 20  # stay under what the host reads in one frame (8 MiB)
REQUEST_TIMEOUT = 60.0  # waiting for hello/request frames
STREAM_TIMEOUT = 300.0  # between upload/stdin frames
EXIT_DRAIN = 0.2  # after exit, keep streaming already-readable output at most this long
KILL_GRACE = 10.0  # after a timeout SIGKILL, give up waiting for the exit this much later
DEFAULT_ENV_DROP = ("ABX_GUEST_TOKEN",)
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"  # runtime.validate's, kept equal by a test


class GuestError(Exception):
    """An error reported to the client as ``{"done": true, "error": {...}}``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _bad(message: str) -> GuestError:
    return GuestError("invalid_argument", message)


def _kind(mode: int) -> str:
    import stat

    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _os_error(exc: OSError, what: str) -> GuestError:
    """Map an OSError to a wire error with a message naming the path or program."""
    import errno

    reason = exc.strerror or str(exc)
    if isinstance(exc, FileNotFoundError):
        return GuestError("not_found", f"{what}: no such file or directory")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        return GuestError("resource_exhausted", f"{what}: {reason}")
    if isinstance(
        exc, (PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
    ) or exc.errno in (
        errno.ENOTEMPTY,
        errno.EINVAL,
        errno.EXDEV,
        errno.ELOOP,
        errno.ENAMETOOLONG,
        errno.EBUSY,
        errno.ENXIO,  # a device with nothing behind it (/dev/tty without a terminal)
        errno.EROFS,
        errno.ETXTBSY,
    ):
        return _bad(f"{what}: {reason}")
    return GuestError("internal", f"{what}: {reason}")


# ---------------------------------------------------------------- argument checks


def _path(req: Req, key: str = "path") -> str:
    value = req.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(f"'{key}' must be a non-empty string")
    if "\0" in value:
        raise _bad(f"'{key}' contains a NUL byte")
    if not value.startswith("/"):
        raise _bad(f"'{key}' must be an absolute path, got {value!r}")
    return value


def _int(req: Req, key: str, default: Optional[int], lo: int, hi: int) -> Optional[int]:
    value = req.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _bad(f"'{key}' must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _timeout(req: Req) -> Optional[float]:
    value = req.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise _bad(f"'timeout' must be a positive number or null, got {value!r}")
    return float(value)


def _pid(req: Req) -> int:
    if req.get("pid") is None:
        raise _bad("'pid' is required")
    return int(_int(req, "pid", None, 1, 1 << 22) or 0)


def _str_list(value: Any, key: str) -> List[str]:
    if not isinstance(value, list) or not value:
        raise _bad(f"'{key}' must be a non-empty list of strings")
    for item in value:
        if not isinstance(item, str) or "\0" in item:
            raise _bad(f"'{key}' items must be strings without NUL bytes")
    return value


def _env(value: Any) -> Dict[str, str]:
    if value is None:  # default: the agent's own environment minus its secrets
        return {k: v for k, v in os.environ.items() if k not in DEFAULT_ENV_DROP}
    if not isinstance(value, dict):
        raise _bad("'env' must be an object of string values")
    for key, val in value.items():
        if not re.fullmatch(ENV_NAME_PATTERN, key) or not isinstance(val, str) or "\0" in val:
            raise _bad(f"invalid environment variable {key!r}")
    return value


def _exit_code(status: int) -> int:
    """Shell convention: killed by signal N -> 128 + N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 255


# ---------------------------------------------------------------- process table


class Subscriber:
    """Output chunks not yet delivered to one streaming client (guarded by proc.cond)."""

    __slots__ = ("chunks", "size", "dropped", "cancelled")

    def __init__(self) -> None:
        self.chunks: Deque[Tuple[str, bytes]] = deque()
        self.size = 0
        self.dropped = False
        self.cancelled = False

    def push(self, name: str, data: bytes) -> None:
        self.chunks.append((name, data))
        self.size += len(data)
        while self.size > SUB_BACKLOG:  # slow client: keep the tail, like the buffers do
            self.size -= len(self.chunks.popleft()[1])
            self.dropped = True

    def take(self) -> List[Tuple[str, bytes]]:
        items = list(self.chunks)
        self.chunks.clear()
        self.size = 0
        return items


class Proc:
    """One child process: tail buffers, exit status, live subscribers."""

    def __init__(
        self,
        popen: Any,
        argv: List[str],
        max_output: int,
        background: bool,
        on_finished: Callable[["Proc"], None],
    ) -> None:
        self.popen = popen
        self.pid: int = popen.pid
        self.argv = argv
        self.max_output = max_output
        self.background = background
        self.started_at = time.time()
        self.cond = threading.Condition(threading.Lock())
        self.buffers: Dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.truncated = False
        self.exit_code: Optional[int] = None
        self.drained = False  # output readable at exit time has been collected
        self.finished = False
        self.subs: List[Subscriber] = []
        self.stdin_lock = threading.Lock()
        self.stdin_fd: Optional[int] = popen.stdin.fileno() if popen.stdin else None
        self._on_finished = on_finished
        self._wake_r, self._wake_w = os.pipe()
        self._wake_open = True

    # -- output
    def subscribe(self, replay: bool) -> Subscriber:
        sub = Subscriber()
        with self.cond:
            if replay:
                for name, buf in self.buffers.items():
                    if buf:
                        sub.push(name, bytes(buf))
            self.subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        with self.cond:
            if sub in self.subs:
                self.subs.remove(sub)

    def cancel(self, sub: Subscriber) -> None:
        with self.cond:
            sub.cancelled = True
            self.cond.notify_all()

    def _add(self, name: str, data: bytes) -> None:
        with self.cond:
            buf = self.buffers[name]
            buf += data
            if len(buf) > self.max_output:
                del buf[: len(buf) - self.max_output]
                self.truncated = True
            if not self.finished:
                for sub in self.subs:
                    sub.push(name, data)
                self.cond.notify_all()

    def snapshot(self) -> Tuple[bytes, bytes]:
        with self.cond:
            return bytes(self.buffers["stdout"]), bytes(self.buffers["stderr"])

    def release_output(self) -> None:
        """Foreground output was delivered already; don't keep up to 2x max_output around."""
        with self.cond:
            self.buffers = {"stdout": bytearray(), "stderr": bytearray()}

    def pump(self) -> None:
        """Read stdout/stderr until EOF; runs in its own thread."""
        poller = select.poll()
        fds: Dict[int, str] = {}
        for name, pipe in (("stdout", self.popen.stdout), ("stderr", self.popen.stderr)):
            fds[pipe.fileno()] = name
            poller.register(pipe.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        drain_until: Optional[float] = None
        while fds:
            events = poller.poll(0 if drain_until is not None else None)
            if drain_until is not None and (not events or time.monotonic() > drain_until):
                # Exit seen and nothing left that was written before it: the command is
                # done. Keep reading (into the tail buffer) so that background grandchildren
                # holding the pipe don't get SIGPIPE.
                self._set_drained()
                drain_until = None
                continue
            for fd, _ in events:
                if fd == self._wake_r:
                    poller.unregister(fd)
                    self._close_wake()
                    drain_until = time.monotonic() + EXIT_DRAIN
                    continue
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    data = b""
                if data:
                    self._add(fds[fd], data)
                else:
                    poller.unregister(fd)
                    del fds[fd]
        self.popen.stdout.close()
        self.popen.stderr.close()
        self._close_wake()
        self._set_drained()

    # -- lifecycle
    def on_exit(self, code: int) -> None:
        """Called by the reaper thread; never blocks on anything but self.cond."""
        with self.cond:
            if self.exit_code is not None:
                return
            self.exit_code = code
            self.popen.returncode = code  # we reap ourselves; Popen must never waitpid
            if self._wake_open:
                os.write(self._wake_w, b"x")
                return
        self._set_drained()

    def _close_wake(self) -> None:
        with self.cond:  # under cond so on_exit never writes to a closed (reused) fd
            if self._wake_open:
                self._wake_open = False
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _set_drained(self) -> None:
        with self.cond:
            self.drained = True
            if self.exit_code is None or self.finished:
                return
            self.finished = True
            self.cond.notify_all()
        self._drop_stdin()
        self._on_finished(self)

    def signal(self, sig: int) -> bool:
        if self.finished:
            return False  # the group may be gone and its id reused
        try:
            os.killpg(self.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    # -- stdin
    def write_stdin(self, data: bytes) -> bool:
        """Write all of data (caller holds stdin_lock); False if the process closed it."""
        view = memoryview(data)
        while view and self.stdin_fd is not None:
            try:
                view = view[os.write(self.stdin_fd, view) :]
            except OSError:  # EPIPE: the reader is gone; drop the rest
                self.close_stdin_locked()
                return False
        return self.stdin_fd is not None

    def close_stdin_locked(self) -> None:
        if self.stdin_fd is not None:
            self.stdin_fd = None
            try:
                self.popen.stdin.close()
            except OSError:
                pass

    def _drop_stdin(self) -> None:
        # Never block here (we may be the reaper): a writer holding the lock closes it later.
        if self.stdin_lock.acquire(blocking=False):
            try:
                self.close_stdin_locked()
            finally:
                self.stdin_lock.release()

    def info(self) -> Dict[str, Any]:
        return {
            "pid": self.pid,
            "argv": self.argv,
            "running": not self.finished,
            "exit_code": self.exit_code if self.finished else None,
            "started_at": self.started_at,
            "background": self.background,
        }


class ProcTable:
    """pid -> Proc, plus the reaper that waits for every child (we may be PID 1)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.procs: Dict[int, Proc] = {}
        self.finished: Deque[Proc] = deque()
        self.spawned = threading.Event()
        # Paused by the engine (rootless: no freezer): every process but us is stopped,
        # and nothing new may start until it thaws us.
        self.paused = False
        # Rootless without cgroups: the memory limit is an address-space rlimit on every
        # process we start (not on us: our threads' malloc arenas alone would exceed a
        # small one). Bound beforehand: the child of a threaded fork must not import.
        self.child_limit: Optional[Callable[[], None]] = None
        limit = os.environ.pop("ABX_GUEST_RLIMIT_AS", "")
        if limit.isdigit():
            import functools
            import resource

            self.child_limit = functools.partial(
                resource.setrlimit, resource.RLIMIT_AS, (int(limit), int(limit)))

    def spawn(
        self,
        argv: List[str],
        cwd: str,
        env: Dict[str, str],
        max_output: int,
        stdin: bool,
        background: bool,
        subscribe: bool,
    ) -> Tuple[Proc, Optional[Subscriber]]:
        import subprocess

        if not os.path.isdir(cwd):
            raise GuestError("not_found", f"working directory {cwd} does not exist")
        # Spawning under the table lock means the reaper cannot see the child's exit before
        # the child is registered, so no "early exits" bookkeeping (or pid-reuse
        # confusion with reaped orphans) is needed.
        with self.lock:
            if self.paused:
                raise GuestError("wrong_state", "the sandbox is paused: resume it first")
            try:
                popen = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    bufsize=0,
                    close_fds=True,
                    start_new_session=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                    preexec_fn=self.child_limit,
                )
            except FileNotFoundError:
                raise GuestError(
                    "not_found",
                    f"cannot execute {argv[0]!r}: no such program (PATH={env.get('PATH', '')})",
                ) from None
            except OSError as exc:
                raise _bad(f"cannot execute {argv[0]!r}: {exc.strerror or exc}") from None
            proc = Proc(popen, argv, max_output, background, self._on_finished)
            old = self.procs.pop(proc.pid, None)
            if old is not None and old in self.finished:
                self.finished.remove(old)  # pid reused
            self.procs[proc.pid] = proc
        self.spawned.set()
        sub = proc.subscribe(replay=False) if subscribe else None
        threading.Thread(target=proc.pump, name=f"pump-{proc.pid}", daemon=True).start()
        return proc, sub

    def get(self, pid: int) -> Proc:
        with self.lock:
            proc = self.procs.get(pid)
        if proc is None:
            raise GuestError(
                "not_found",
                f"no process with pid {pid} (it was never started"
                " by this agent or has been evicted)",
            )
        return proc

    def list(self) -> List[Proc]:
        with self.lock:
            return list(self.procs.values())

    def _on_finished(self, proc: Proc) -> None:
        with self.lock:
            if self.procs.get(proc.pid) is not proc:
                return
            self.finished.append(proc)
            while len(self.finished) > FINISHED_KEPT:
                old = self.finished.popleft()
                if self.procs.get(old.pid) is old:
                    del self.procs[old.pid]

    def reap_forever(self) -> None:
        """Wait for any child, ours or orphans reparented to PID 1."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                self.spawned.wait()
                self.spawned.clear()
                continue
            with self.lock:
                proc = self.procs.get(pid)
            if proc is not None:
                proc.on_exit(_exit_code(status))

    def kill_all(self) -> None:
        for proc in self.list():
            proc.signal(signal.SIGKILL)

    def set_paused(self, paused: bool) -> None:
        """Stop (or continue) every process in the sandbox except this one: as pid 1,
        kill(-1) reaches all of them and never ourselves."""
        with self.lock:  # no spawn in flight
            self.paused = paused
            try:
                os.kill(-1, signal.SIGSTOP if paused else signal.SIGCONT)
            except OSError:
                pass  # no other process
            if paused:
                _wait_stopped()


def _wait_stopped(limit: float = 2.0) -> None:
    """Return once every other process shows as stopped (a signal lands when its target
    next runs); stragglers forked meanwhile are stopped too."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        running = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or name == "1":
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in (b"T", b"t", b"Z", b"X"):
                running.append(int(name))
        if not running:
            return
        for pid in running:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        time.sleep(0.001)


# ---------------------------------------------------------------- connection handling


class Conn:
    """One client connection: socket, buffered reader, optional reader thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile: BinaryIO = sock.makefile("rb")
        self.reader: Optional[threading.Thread] = None

    def send(self, obj: Dict[str, Any], payload: bytes = b"") -> None:
        proto.send_frame(self.sock, obj, payload)

    def done(self, **fields: Any) -> None:
        fields["done"] = True
        self.send(fields)

    def recv(self, what: str) -> proto.Frame:
        frame = proto.read_frame(self.rfile)
        if frame is None:
            raise ConnectionResetError(f"client closed the connection while sending {what}")
        return frame

    def close(self) -> None:
        """Half-close, then read until the client closes: avoids a TCP RST eating our reply."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            if self.reader is not None:
                self.reader.join(2.0)
            else:
                self.sock.settimeout(2.0)
                deadline = time.monotonic() + 2.0
                while time.monotonic() < deadline and self.sock.recv(65536):
                    pass
        except OSError:
            pass
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader thread still in recv
        except OSError:
            pass
        self.rfile.close()
        self.sock.close()


class Agent:
    def __init__(self, token: Optional[str]) -> None:
        self.token = token
        self.table = ProcTable()
        self.ops: Dict[str, Callable[[Conn, Req], None]] = {
            "ping": self.op_ping,
            "exec": self.op_exec,
            "output": self.op_output,
            "wait": self.op_wait,
            "kill": self.op_kill,
            "stdin": self.op_stdin,
            "ps": self.op_ps,
            "read": self.op_read,
            "write": self.op_write,
            "list": self.op_list,
            "stat": self.op_stat,
            "exists": self.op_exists,
            "mkdir": self.op_mkdir,
            "remove": self.op_remove,
            "rename": self.op_rename,
            "freeze": self.op_freeze,
            "thaw": self.op_thaw,
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
                    raise _bad(f"unknown op {op!r}; known ops: {', '.join(sorted(self.ops))}")
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
            raise _bad("authentication required: send {'op': 'hello', 'token': ...} first")
        return req

    def _check_token(self, given: Any) -> None:
        if self.token is None:
            return
        import hmac

        if not isinstance(given, str) or not hmac.compare_digest(
            given.encode("utf-8"), self.token.encode("utf-8")
        ):
            raise _bad("authentication failed: wrong guest token")

    # -- processes
    def op_ping(self, conn: Conn, req: Req) -> None:
        conn.done(pid=os.getpid(), version=proto.VERSION, python="%d.%d.%d" % sys.version_info[:3])

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
        argv = _str_list(req.get("argv"), "argv")
        cwd = _path({"cwd": req.get("cwd") or "/"}, "cwd")
        env = _env(req.get("env"))
        timeout = _timeout(req)
        max_output = int(_int(req, "max_output", 1 << 20, 0, MAX_OUTPUT_CAP) or 0)
        background = bool(req.get("background"))
        stdin = bool(req.get("stdin"))
        proc, sub = self.table.spawn(
            argv, cwd, env, max_output, stdin, background, subscribe=not background
        )
        if background or sub is None:
            conn.done(pid=proc.pid)
            return
        conn.sock.settimeout(None)
        try:
            conn.send({"started": True, "pid": proc.pid})
            # Watching for the client going away costs a thread per exec; a command with
            # a deadline ends by itself, so only stdin or an open-ended run needs it.
            if stdin or timeout is None:
                conn.reader = threading.Thread(
                    target=self._watch, args=(conn, proc, sub, stdin), daemon=True
                )
                conn.reader.start()
            timed_out, cancelled = self._stream(conn, proc, sub, timeout, kill=True)
        except BaseException:
            proc.signal(signal.SIGKILL)  # client gone mid-stream: don't leave it running
            raise
        finally:
            proc.unsubscribe(sub)
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

    def _watch(self, conn: Conn, proc: Proc, sub: Subscriber, stdin: bool) -> None:
        """Foreground exec: forward stdin frames, then notice the client disconnecting."""
        holding = False
        try:
            if stdin:
                proc.stdin_lock.acquire()
                holding = True
                self._pipe_stdin(conn, proc, close_on_eof=True)
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

    def _pipe_stdin(self, conn: Conn, proc: Proc, close_on_eof: bool) -> None:
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
        self, conn: Conn, proc: Proc, sub: Subscriber, timeout: Optional[float], kill: bool
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
                finished, cancelled = proc.finished, sub.cancelled
            self._send_chunks(conn, chunks)
            if finished or cancelled:
                return timed_out, cancelled
            if deadline is not None and time.monotonic() >= deadline:
                if not kill or timed_out:  # wait timeout, or SIGKILL did not finish it
                    return True, False
                timed_out = True
                proc.signal(signal.SIGKILL)
                deadline = time.monotonic() + KILL_GRACE

    def _send_chunks(self, conn: Conn, chunks: List[Tuple[str, bytes]]) -> None:
        # Coalesce consecutive chunks of one stream: fewer frames for chatty programs.
        pending: List[bytes] = []
        size = 0
        name = ""
        for stream, data in chunks:
            if pending and (stream != name or size + len(data) > proto.CHUNK):
                conn.send({"stream": name}, b"".join(pending))
                pending, size = [], 0
            name = stream
            pending.append(data)
            size += len(data)
        if pending:
            conn.send({"stream": name}, b"".join(pending))

    def op_output(self, conn: Conn, req: Req) -> None:
        proc = self.table.get(_pid(req))
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
        self._send_chunks(conn, [("stdout", out), ("stderr", err)])  # too big for one frame
        conn.done(stdout_len=0, **final)

    def op_wait(self, conn: Conn, req: Req) -> None:
        proc = self.table.get(_pid(req))
        timeout = _timeout(req)
        sub = proc.subscribe(replay=True)
        conn.sock.settimeout(None)
        try:
            timed_out, _ = self._stream(conn, proc, sub, timeout, kill=False)
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
        proc = self.table.get(_pid(req))
        sig = int(_int(req, "signal", 9, 1, 64) or 9)
        conn.done(killed=proc.signal(sig))

    def op_stdin(self, conn: Conn, req: Req) -> None:
        proc = self.table.get(_pid(req))
        if proc.stdin_fd is None:
            raise GuestError(
                "wrong_state",
                f"process {proc.pid} has no open stdin (start it"
                " with stdin_open=True; it may have exited or closed it)",
            )
        with proc.stdin_lock:
            conn.send({"ready": True})
            conn.sock.settimeout(STREAM_TIMEOUT)
            self._pipe_stdin(conn, proc, close_on_eof=False)
        conn.done()

    def op_ps(self, conn: Conn, req: Req) -> None:
        procs = sorted(self.table.list(), key=lambda p: p.started_at)
        conn.done(processes=[p.info() for p in procs])

    # -- files
    def op_read(self, conn: Conn, req: Req) -> None:
        import stat

        path = _path(req)
        offset = int(_int(req, "offset", 0, 0, 1 << 62) or 0)
        limit = _int(req, "limit", None, 0, 1 << 62)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as exc:
            raise _os_error(exc, path) from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise _bad(f"{path}: is a {_kind(mode)}, not a regular file")
            os.set_blocking(fd, True)
            if offset:
                os.lseek(fd, offset, os.SEEK_SET)
            sent = self._send_file(conn, fd, limit, path)
        finally:
            os.close(fd)
        conn.done(size=sent)

    def _send_file(self, conn: Conn, fd: int, limit: Optional[int], path: str) -> int:
        sent = 0
        while limit is None or sent < limit:
            want = proto.CHUNK if limit is None else min(proto.CHUNK, limit - sent)
            try:
                data = os.read(fd, want)
            except OSError as exc:
                raise _os_error(exc, path) from None
            if not data:
                break
            conn.send({"chunk": True}, data)
            sent += len(data)
        return sent

    def op_write(self, conn: Conn, req: Req) -> None:
        path = _path(req)
        mode = int(_int(req, "mode", 0o644, 0, 0o7777) or 0)
        append = bool(req.get("append"))
        try:
            mode_now = os.stat(path).st_mode
        except OSError:
            mode_now = None
        if mode_now is not None and not stat.S_ISREG(mode_now):
            # Never a device node, FIFO or socket: writing /dev/zero is a mistake, not a file.
            raise _bad(f"{path}: is a {_kind(mode_now)}; files.write writes regular files")
        parent = os.path.dirname(path)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise _os_error(exc, parent) from None
        if append:
            size = self._write_append(conn, path, mode)
        else:
            size = self._write_atomic(conn, path, mode)
        conn.done(size=size)

    def _receive_into(self, conn: Conn, fd: int, path: str) -> int:
        conn.send({"ready": True})
        conn.sock.settimeout(STREAM_TIMEOUT)
        size = 0
        while True:
            obj, payload = conn.recv("file data")
            view = memoryview(payload)
            while view:
                try:
                    view = view[os.write(fd, view) :]
                except OSError as exc:
                    raise _os_error(exc, path) from None
            size += len(payload)
            if obj.get("eof"):
                return size

    def _write_append(self, conn: Conn, path: str, mode: int) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
        try:
            created = False
            try:
                fd = os.open(path, flags)
            except FileNotFoundError:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
                created = True
        except OSError as exc:
            raise _os_error(exc, path) from None
        try:
            if created:
                os.fchmod(fd, mode)  # bypass the umask, like the atomic path does
            return self._receive_into(conn, fd, path)
        finally:
            os.close(fd)

    def _write_atomic(self, conn: Conn, path: str, mode: int) -> int:
        directory, name = os.path.split(path)
        tmp = os.path.join(directory, f".{name}.abx-{os.urandom(6).hex()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            # The directory exists (made above) but takes no new files: /proc, /sys.
            raise _bad(f"{path}: its directory does not accept new files") from None
        except OSError as exc:
            raise _os_error(exc, path) from None
        try:
            try:
                size = self._receive_into(conn, fd, path)
                os.fchmod(fd, mode)
                self._keep_owner(fd, path)
            finally:
                os.close(fd)
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise _os_error(exc, path) from None
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return size

    def _keep_owner(self, fd: int, path: str) -> None:
        """Replacing a file must not silently hand it over to root."""
        try:
            st = os.lstat(path)
            os.fchown(fd, st.st_uid, st.st_gid)
        except OSError:
            pass

    def op_list(self, conn: Conn, req: Req) -> None:
        root = _path(req)
        depth = int(_int(req, "depth", 1, 1, 1 << 16) or 1)
        if not os.path.isdir(root):  # follows a symlink for the root only
            if not os.path.lexists(root):
                raise GuestError("not_found", f"{root}: no such file or directory")
            raise _bad(f"{root}: not a directory")
        entries: List[Dict[str, Any]] = []
        stack = [(root, 1)]
        truncated = False
        size = 0
        while stack and not truncated:
            directory, level = stack.pop()
            try:
                with os.scandir(directory) as it:
                    children = sorted(it, key=lambda e: e.name)
            except OSError as exc:
                if directory == root:
                    raise _os_error(exc, root) from None
                continue  # unreadable subdirectory: skip it
            subdirs = []
            for child in children:
                if len(entries) >= LIST_CAP or size >= LIST_JSON_CAP:
                    truncated = True
                    break
                try:
                    entry = _entry(child.path, child.stat(follow_symlinks=False))
                except OSError:
                    continue  # vanished while listing
                entries.append(entry)
                size += len(proto.encode_json(entry)) + 1
                if level < depth and child.is_dir(follow_symlinks=False):
                    subdirs.append((child.path, level + 1))
            stack.extend(reversed(subdirs))
        conn.done(entries=entries, truncated=truncated)

    def op_stat(self, conn: Conn, req: Req) -> None:
        path = _path(req)
        try:
            conn.done(entry=_entry(path, os.lstat(path)))
        except OSError as exc:
            raise _os_error(exc, path) from None

    def op_exists(self, conn: Conn, req: Req) -> None:
        conn.done(exists=os.path.lexists(_path(req)))

    def op_mkdir(self, conn: Conn, req: Req) -> None:
        path = _path(req)
        mode = int(_int(req, "mode", 0o755, 0, 0o7777) or 0)
        try:
            if req.get("parents", True):
                if os.path.lexists(path) and not os.path.isdir(path):
                    raise _bad(f"{path}: exists and is not a directory")
                os.makedirs(path, mode, exist_ok=True)
            else:
                os.mkdir(path, mode)
        except OSError as exc:
            raise _os_error(exc, path) from None
        conn.done()

    def op_remove(self, conn: Conn, req: Req) -> None:
        path = _path(req)
        if os.path.normpath(path).strip("/") == "" or os.path.realpath(path) == "/":
            raise _bad("refusing to remove '/'")
        recursive = bool(req.get("recursive", True))
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                if recursive:
                    import shutil

                    shutil.rmtree(path)
                else:
                    os.rmdir(path)
            else:
                os.unlink(path)
        except OSError as exc:
            raise _os_error(exc, path) from None
        conn.done()

    def op_rename(self, conn: Conn, req: Req) -> None:
        src, dst = _path(req, "src"), _path(req, "dst")
        try:
            os.rename(src, dst)
        except OSError as exc:
            raise _os_error(exc, f"rename {src} -> {dst}") from None
        conn.done()


def _entry(path: str, st: os.stat_result) -> Dict[str, Any]:
    import stat

    if stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    elif stat.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    entry = {
        "name": os.path.basename(path.rstrip("/")) or "/",
        "path": path,
        "type": kind,
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }
    if kind == "symlink":
        try:
            entry["target"] = os.readlink(path)
        except OSError:
            entry["target"] = None
    return entry


# ---------------------------------------------------------------- startup


def _listen_unix(path: str) -> socket.socket:
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


def _listen_tcp(spec: str) -> socket.socket:
    host, _, port = spec.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(128)
    return srv


def _listen_fd(spec: str) -> socket.socket:
    # A listener the host bound in a directory of its own and handed over (runc
    # --preserve-fds): the host knows what it connects to, whatever happens in here.
    srv = socket.socket(fileno=int(spec))
    os.set_inheritable(srv.fileno(), False)
    return srv


def _quiet_stdio() -> None:
    # The host reads our output only until we are ready, then closes its end.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)


def _parse_args(argv: List[str]) -> Tuple[str, str]:
    # Hand-rolled: argparse costs several ms of startup.
    usage = "usage: agent.py (--listen-fd N | --unix PATH | --tcp HOST:PORT)"
    if len(argv) != 2 or argv[0] not in ("--listen-fd", "--unix", "--tcp"):
        sys.stderr.write(usage + "\n")
        raise SystemExit(2)
    return argv[0][2:], argv[1]


def _not_dumpable() -> None:
    """Make the guest untouchable from inside its sandbox.

    A non-dumpable process can be ptraced, or have its /proc/<pid>/mem and fds taken,
    only with CAP_SYS_PTRACE, which no sandbox process has. Programs the guest starts
    become dumpable again when they exec, so they can still be debugged.
    """
    import ctypes

    pr_set_dumpable = 4
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no libc to call (exotic template): seccomp still guards pid 1


def main(argv: Optional[List[str]] = None) -> None:
    kind, where = _parse_args(sys.argv[1:] if argv is None else argv)
    token = os.environ.pop("ABX_GUEST_TOKEN", None) or None  # never leak it to children
    if kind == "tcp" and token is None:
        sys.stderr.write("abx-guest: --tcp requires the ABX_GUEST_TOKEN environment variable\n")
        raise SystemExit(2)
    _not_dumpable()
    threading.stack_size(1 << 20)  # many connection threads; default 8 MiB is wasteful
    # Every exec hands off between threads (pump, reaper, connection); the default 5 ms
    # GIL switch interval shows up directly in the round trip.
    sys.setswitchinterval(0.0002)
    agent = Agent(token)
    listen = {"listen-fd": _listen_fd, "unix": _listen_unix, "tcp": _listen_tcp}[kind]
    srv = listen(where)

    def on_term(signum: int, frame: Any) -> None:
        agent.table.kill_all()
        if kind == "unix":
            try:
                os.unlink(where)
            except OSError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    threading.Thread(target=agent.table.reap_forever, name="reaper", daemon=True).start()
    threading.Thread(target=__import__, args=("subprocess",), daemon=True).start()  # warm up
    addr = srv.getsockname()
    shown = f"{addr[0]}:{addr[1]}" if kind == "tcp" else where
    sys.stdout.write(f"abx-guest ready {kind} {shown} pid={os.getpid()}\n")
    sys.stdout.flush()
    if kind == "listen-fd":
        _quiet_stdio()
    _serve(agent, srv, kind == "tcp")


def _serve(agent: Agent, srv: socket.socket, tcp: bool) -> None:
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


if __name__ == "__main__":
    main()
