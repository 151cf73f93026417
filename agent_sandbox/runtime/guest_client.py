"""Host-side client of the in-sandbox guest agent (``agent_sandbox/guest/agent.py``).

Every method opens its own connection (unix socket or TCP), sends one request and reads
the reply frames, so a single ``GuestClient`` is safe to share between threads.

The guest runs inside the sandbox, so everything it says is hostile input: frames are
capped (``MAX_REPLY_JSON``), a call has an overall deadline as well as a per-frame one, a
call collects a bounded number of frames and bytes, and every field read is type-checked.
A guest that breaks these rules gets ``GuestProtocolError``, never a pinned thread, a
grown host process or a stray exception.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from agent_sandbox.errors import (
    RuntimeUnavailableError,
    SandboxError,
    SandboxTimeoutError,
    error_from_code,
)
from agent_sandbox.guest import protocol as proto

Address = str | tuple[str, int]
OutputCallback = Callable[[bytes], None]
DEFAULT_IO_TIMEOUT = 60.0
STREAM_GRACE = 30.0  # extra time granted on top of a command timeout before giving up
MAX_REPLY_JSON = 8 << 20  # the largest JSON a guest reply may carry (a listing's 10k entries)
MAX_CALL_FRAMES = 64  # frames a request/reply call may see before its final one
MAX_ERROR_TEXT = 4000


class GuestUnavailableError(RuntimeUnavailableError):
    """The guest agent cannot be reached, or the connection broke mid-request."""

    code = "runtime_unavailable"


class GuestProtocolError(RuntimeUnavailableError):
    """The guest answered something no honest guest sends (wrong types, too much, too
    long): the sandbox is misbehaving and its guest must be restarted."""

    code = "runtime_unavailable"


def field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...],
          default: Any = ...) -> Any:
    """``obj[key]`` checked to be of ``kind`` (bool is never an int here)."""
    if key not in obj and default is not ...:
        return default
    value = obj.get(key)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise GuestProtocolError(f"the guest sent an invalid {key!r}: {str(value)[:80]!r}")
    return value


@dataclass
class ExecResult:
    exit_code: int  # 128+N when killed by signal N; -1 when wait() timed out while running
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    pid: int


@dataclass
class ProcOutput:
    stdout: bytes
    stderr: bytes
    running: bool
    exit_code: int | None
    truncated: bool


class _Tail:
    """Keeps the last ``cap`` bytes of a stream and remembers whether it dropped any."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.dropped = False

    def add(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > self.cap:
            del self.buf[: len(self.buf) - self.cap]
            self.dropped = True


class _Conn:
    """One connection to the guest; errors become SandboxError subclasses.

    ``deadline`` (monotonic) ends the whole call however steadily the guest sends;
    the socket timeout bounds each frame."""

    def __init__(self, sock: socket.socket, what: str) -> None:
        self.sock = sock
        self.rfile: BinaryIO = sock.makefile("rb")
        self.what = what
        self.deadline: float | None = None
        self.frame_timeout: float | None = None

    def limit(self, frame_timeout: float | None, total: float | None) -> None:
        self.frame_timeout = frame_timeout
        self.deadline = None if total is None else time.monotonic() + total
        self.sock.settimeout(frame_timeout)

    def send(self, obj: dict[str, Any], payload: bytes = b"") -> None:
        try:
            proto.send_frame(self.sock, obj, payload)
        except OSError as exc:
            raise GuestUnavailableError(f"guest connection lost during {self.what}: {exc}") from exc

    def recv(self) -> tuple[dict[str, Any], bytes]:
        """Next frame; raises the guest's error if it is an error frame."""
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise SandboxTimeoutError(f"guest did not finish {self.what} in time")
            self.sock.settimeout(left if self.frame_timeout is None
                                 else min(left, self.frame_timeout))
        try:
            frame = proto.read_frame(self.rfile, MAX_REPLY_JSON)
        except TimeoutError as exc:
            raise SandboxTimeoutError(f"guest did not answer {self.what} in time") from exc
        except (proto.ProtocolError, RecursionError, MemoryError) as exc:
            raise GuestProtocolError(f"guest sent an invalid frame during {self.what}: "
                                     f"{str(exc)[:200]}") from None
        except OSError as exc:
            raise GuestUnavailableError(
                f"guest connection broke during {self.what}: {exc}"
            ) from exc
        if frame is None:
            raise GuestUnavailableError(f"guest closed the connection during {self.what}")
        err = frame[0].get("error")
        if err:
            if not isinstance(err, dict):
                raise GuestProtocolError(f"guest sent an invalid error during {self.what}")
            raise error_from_code(str(err.get("code", "internal"))[:40],
                                  str(err.get("message", "guest error"))[:MAX_ERROR_TEXT])
        return frame

    def recv_after_send_failure(self, exc: SandboxError) -> None:
        """A send failed: the guest probably replied with an error first; surface that."""
        try:
            for _ in range(MAX_CALL_FRAMES):
                obj, _ = self.recv()
                if obj.get("done"):
                    break
        except GuestUnavailableError:
            raise exc from None

    def close(self) -> None:
        _shutdown(self.sock)  # unblocks a stdin feeder thread
        self.rfile.close()
        self.sock.close()


class Cancel:
    """Ends an open-ended call from another thread: its connection is shut down (the
    guest then kills a foreground command), whether the call has connected yet or not."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.cancelled = False

    def _bind(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.cancelled:
                _shutdown(sock)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._sock is not None:
                _shutdown(self._sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class GuestClient:
    """Blocking client; one connection per call."""

    def __init__(
        self,
        address: Address,
        token: str | None = None,
        connect_timeout: float = 5.0,
        io_timeout: float | None = DEFAULT_IO_TIMEOUT,
    ) -> None:
        self.address = address
        self.token = token
        self.connect_timeout = connect_timeout
        self.io_timeout = io_timeout

    # ------------------------------------------------------------ plumbing
    def _connect(self, what: str) -> _Conn:
        if isinstance(self.address, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            sock = socket.socket(
                socket.AF_INET6 if ":" in self.address[0] else socket.AF_INET, socket.SOCK_STREAM
            )
        try:
            sock.settimeout(self.connect_timeout)
            sock.connect(self.address)
        except OSError as exc:
            sock.close()
            raise GuestUnavailableError(
                f"cannot connect to the guest agent at {self.address!r}: {exc}"
            ) from exc
        if not isinstance(self.address, str):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Conn(sock, what)

    def _open(self, req: dict[str, Any], total: Any = ..., *,
              frame_timeout: Any = ...) -> _Conn:
        """Connect, authenticate and send the request frame. ``total`` bounds the whole
        call, ``frame_timeout`` each frame; both default to the client's io_timeout."""
        conn = self._connect(str(req["op"]))
        try:
            conn.limit(self.io_timeout if frame_timeout is ... else frame_timeout,
                       self.io_timeout if total is ... else total)
            if self.token is not None:  # pipelined: the guest does not answer hello
                conn.send({"op": "hello", "token": self.token})
            conn.send(req)
        except BaseException:
            conn.close()
            raise
        return conn

    def _call(self, req: dict[str, Any]) -> dict[str, Any]:
        conn = self._open(req)
        try:
            return _final(conn)
        finally:
            conn.close()

    # ------------------------------------------------------------ processes
    def ping(self) -> dict[str, Any]:
        reply = self._call({"op": "ping"})
        reply.pop("done", None)
        return reply

    def ping_within(self, seconds: float) -> None:
        """One ping that may wait up to ``seconds`` for the guest to answer (it may still
        be starting: a host-made listener accepts the connection before the guest does)."""
        conn = self._open({"op": "ping"}, seconds, frame_timeout=seconds)
        try:
            _final(conn)
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 10.0, interval: float = 0.005) -> dict[str, Any]:
        """Ping until the guest answers; for callers that just started the sandbox."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.ping()
            except GuestUnavailableError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(interval)

    def exec(
        self,
        argv: Iterable[str],
        *,
        cwd: str = "/workspace",
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        max_output: int = 1 << 20,
        stdin: bytes | Iterable[bytes] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cancel: Cancel | None = None,
    ) -> ExecResult:
        """Run a command to completion, streaming output to the callbacks as it arrives
        (or until ``cancel`` ends it: the guest kills the command)."""
        req = {
            "op": "exec",
            "argv": list(argv),
            "cwd": cwd,
            "env": env,
            "timeout": timeout,
            "max_output": max_output,
            "stdin": stdin is not None,
            "background": False,
        }
        total = None if timeout is None else timeout + STREAM_GRACE
        conn = self._open(req, total, frame_timeout=total)
        if cancel is not None:
            cancel._bind(conn.sock)  # noqa: SLF001 - the handle is this module's
        feeder: threading.Thread | None = None
        try:
            started, _ = conn.recv()
            pid = field(started, "pid", int)
            if stdin is not None:
                feeder = threading.Thread(target=_feed_stdin, args=(conn, stdin), daemon=True)
                feeder.start()
            return _collect(conn, pid, max_output, on_stdout, on_stderr)
        finally:
            conn.close()
            if feeder is not None:
                feeder.join(1.0)

    def start(
        self,
        argv: Iterable[str],
        *,
        cwd: str = "/workspace",
        env: dict[str, str] | None = None,
        max_output: int = 1 << 20,
        stdin_open: bool = False,
    ) -> int:
        """Start a background process; it outlives this call. Returns its pid."""
        reply = self._call(
            {
                "op": "exec",
                "argv": list(argv),
                "cwd": cwd,
                "env": env,
                "max_output": max_output,
                "stdin": stdin_open,
                "background": True,
            }
        )
        return int(field(reply, "pid", int))

    def output(self, pid: int, max_output: int = 1 << 20) -> ProcOutput:
        """Output buffered so far (the tail of max_output bytes per stream)."""
        conn = self._open({"op": "output", "pid": pid})
        out, err = _Tail(max_output), _Tail(max_output)
        budget = 2 * max_output + 4 * proto.CHUNK  # what an honest guest's tails can be
        try:
            while True:
                obj, payload = conn.recv()
                if obj.get("done"):
                    break
                budget -= len(payload) + 1
                if budget < 0:
                    raise GuestProtocolError("guest sent more output than it may buffer")
                (out if obj.get("stream") == "stdout" else err).add(payload)
        finally:
            conn.close()
        split = field(obj, "stdout_len", int, 0)
        out.add(payload[:split])
        err.add(payload[split:])
        return ProcOutput(
            stdout=bytes(out.buf),
            stderr=bytes(err.buf),
            running=field(obj, "running", bool),
            exit_code=field(obj, "exit_code", (int, type(None)), None),
            truncated=out.dropped or err.dropped or bool(obj.get("truncated")),
        )

    def wait(
        self,
        pid: int,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        *,
        max_output: int = 1 << 20,
    ) -> ExecResult:
        """Stream buffered then live output until the process ends or timeout passes.

        A timeout only stops waiting: the result has timed_out=True and exit_code=-1 if the
        process is still running.
        """
        total = None if timeout is None else timeout + STREAM_GRACE
        conn = self._open({"op": "wait", "pid": pid, "timeout": timeout}, total,
                          frame_timeout=total)
        try:
            return _collect(conn, pid, max_output, on_stdout, on_stderr)
        finally:
            conn.close()

    def kill(self, pid: int, signal: int = 9) -> bool:
        """Signal the process group; False if the process had already finished."""
        return field(self._call({"op": "kill", "pid": pid, "signal": signal}), "killed", bool)

    def send_stdin(self, pid: int, data: bytes, close: bool = False) -> None:
        """Write to a background process started with stdin_open=True."""
        conn = self._open({"op": "stdin", "pid": pid})
        try:
            conn.recv()  # "ready", or the guest's error (unknown pid, no stdin)
            try:
                for chunk in _chunks(data):
                    conn.send({}, chunk)
                conn.send({"close": True} if close else {"eof": True})
            except GuestUnavailableError as exc:
                conn.recv_after_send_failure(exc)
            _final(conn)
        finally:
            conn.close()

    def ps(self) -> list[dict[str, Any]]:
        return field(self._call({"op": "ps"}), "processes", list)

    def freeze(self) -> None:
        """Stop every process but the guest; new ones are refused until ``thaw``
        (the rootless engine's pause: no cgroup freezer without root)."""
        self._call({"op": "freeze"})

    def thaw(self) -> None:
        self._call({"op": "thaw"})

    # ------------------------------------------------------------ files
    def read(self, path: str, offset: int = 0, limit: int | None = None) -> Iterator[bytes]:
        """Stream a file in chunks. Errors such as not_found are raised here, at call time."""
        conn = self._open({"op": "read", "path": path, "offset": offset, "limit": limit}, None)
        try:
            first = conn.recv()
        except BaseException:
            conn.close()
            raise
        return _ReadStream(conn, first)

    def write(
        self,
        path: str,
        data: bytes | Iterable[bytes] | BinaryIO,
        mode: int = 0o644,
        append: bool = False,
    ) -> int:
        """Upload a file (atomically replaced unless append). Returns bytes written."""
        conn = self._open({"op": "write", "path": path, "mode": mode, "append": append}, None)
        try:
            conn.recv()  # "ready": path checked before we send megabytes
            try:
                for chunk in _chunks(data):
                    conn.send({}, chunk)
                conn.send({"eof": True})
            except GuestUnavailableError as exc:
                conn.recv_after_send_failure(exc)
            return int(field(_final(conn), "size", int))
        finally:
            conn.close()

    def list(self, path: str, depth: int = 1) -> list[dict[str, Any]]:
        return field(self._call({"op": "list", "path": path, "depth": depth}), "entries", list)

    def stat(self, path: str) -> dict[str, Any]:
        return field(self._call({"op": "stat", "path": path}), "entry", dict)

    def exists(self, path: str) -> bool:
        return field(self._call({"op": "exists", "path": path}), "exists", bool)

    def mkdir(self, path: str, parents: bool = True) -> None:
        self._call({"op": "mkdir", "path": path, "parents": parents})

    def remove(self, path: str, recursive: bool = True) -> None:
        self._call({"op": "remove", "path": path, "recursive": recursive})

    def rename(self, src: str, dst: str) -> None:
        self._call({"op": "rename", "src": src, "dst": dst})


class _ReadStream(Iterator[bytes]):
    """Iterator over read() chunks that owns (and always closes) its connection."""

    def __init__(self, conn: _Conn, first: tuple[dict[str, Any], bytes]) -> None:
        self._conn: _Conn | None = conn
        self._pending: tuple[dict[str, Any], bytes] | None = first
        self.size: int | None = None  # bytes sent, known once exhausted

    def __next__(self) -> bytes:
        while self._conn is not None:
            obj, payload = self._pending or self._recv()
            self._pending = None
            if obj.get("done"):
                self.size = field(obj, "size", int, 0)
                self.close()
                break
            if payload:
                return payload
        raise StopIteration

    def _recv(self) -> tuple[dict[str, Any], bytes]:
        assert self._conn is not None
        try:
            return self._conn.recv()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> _ReadStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _collect(
    conn: _Conn,
    pid: int,
    max_output: int,
    on_stdout: OutputCallback | None,
    on_stderr: OutputCallback | None,
) -> ExecResult:
    """Read output frames (firing callbacks live) until the final frame."""
    out, err = _Tail(max_output), _Tail(max_output)
    while True:
        obj, payload = conn.recv()
        if obj.get("done"):
            break
        stream = obj.get("stream")
        if stream == "stdout":
            out.add(payload)
            if on_stdout is not None:
                on_stdout(payload)
        elif stream == "stderr":
            err.add(payload)
            if on_stderr is not None:
                on_stderr(payload)
    code = field(obj, "exit_code", (int, type(None)), None)
    return ExecResult(
        exit_code=-1 if code is None else code,
        stdout=bytes(out.buf),
        stderr=bytes(err.buf),
        timed_out=bool(obj.get("timed_out")),
        truncated=out.dropped or err.dropped or bool(obj.get("truncated")),
        pid=field(obj, "pid", int, pid),
    )


def _final(conn: _Conn) -> dict[str, Any]:
    """The reply's final frame; a guest that keeps sending others is cut off."""
    for _ in range(MAX_CALL_FRAMES):
        obj, _ = conn.recv()
        if obj.get("done"):
            return obj
    raise GuestProtocolError(f"guest sent too many frames for {conn.what}")


def _feed_stdin(conn: _Conn, data: bytes | Iterable[bytes]) -> None:
    """Runs in a thread so output callbacks keep firing while stdin is produced."""
    try:
        for chunk in _chunks(data):
            conn.send({}, chunk)
        conn.send({"eof": True})
    except (SandboxError, OSError, ValueError):
        pass  # the command ended or the connection closed; the reader reports it


def _chunks(
    data: bytes | bytearray | memoryview | Iterable[bytes] | BinaryIO,
) -> Iterator[bytes]:
    """Split any supported payload into frames of at most proto.CHUNK bytes."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = memoryview(data).cast("B")
        for start in range(0, len(view), proto.CHUNK):
            yield bytes(view[start : start + proto.CHUNK])
        return
    read = getattr(data, "read", None)
    if read is not None:
        while chunk := read(proto.CHUNK):
            yield bytes(chunk)
        return
    for item in data:
        yield from _chunks(bytes(item))
