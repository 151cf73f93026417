"""Host-side client of the in-sandbox guest agent (``agent_sandbox/guest/agent.py``).

Every method opens its own connection (unix socket or TCP), sends one request and reads
the reply frames, so a single ``GuestClient`` is safe to share between threads.
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


class GuestUnavailableError(RuntimeUnavailableError):
    """The guest agent cannot be reached, or the connection broke mid-request."""

    code = "runtime_unavailable"


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
    """One connection to the guest; errors become SandboxError subclasses."""

    def __init__(self, sock: socket.socket, what: str) -> None:
        self.sock = sock
        self.rfile: BinaryIO = sock.makefile("rb")
        self.what = what

    def send(self, obj: dict[str, Any], payload: bytes = b"") -> None:
        try:
            proto.send_frame(self.sock, obj, payload)
        except OSError as exc:
            raise GuestUnavailableError(f"guest connection lost during {self.what}: {exc}") from exc

    def recv(self) -> tuple[dict[str, Any], bytes]:
        """Next frame; raises the guest's error if it is an error frame."""
        try:
            frame = proto.read_frame(self.rfile)
        except TimeoutError as exc:
            raise SandboxTimeoutError(f"guest did not answer {self.what} in time") from exc
        except (OSError, proto.ProtocolError) as exc:
            raise GuestUnavailableError(
                f"guest connection broke during {self.what}: {exc}"
            ) from exc
        if frame is None:
            raise GuestUnavailableError(f"guest closed the connection during {self.what}")
        err = frame[0].get("error")
        if err:
            raise error_from_code(
                str(err.get("code", "internal")), str(err.get("message", "guest error"))
            )
        return frame

    def recv_after_send_failure(self, exc: SandboxError) -> None:
        """A send failed: the guest probably replied with an error first; surface that."""
        try:
            while True:
                obj, _ = self.recv()
                if obj.get("done"):
                    break
        except GuestUnavailableError:
            raise exc from None

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # unblocks a stdin feeder thread
        except OSError:
            pass
        self.rfile.close()
        self.sock.close()


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

    def _open(
        self, req: dict[str, Any], io_timeout: float | None = None, default_timeout: bool = True
    ) -> _Conn:
        """Connect, authenticate and send the request frame."""
        conn = self._connect(str(req["op"]))
        try:
            conn.sock.settimeout(self.io_timeout if default_timeout else io_timeout)
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
            while True:
                obj, _ = conn.recv()
                if obj.get("done"):
                    return obj
        finally:
            conn.close()

    # ------------------------------------------------------------ processes
    def ping(self) -> dict[str, Any]:
        reply = self._call({"op": "ping"})
        reply.pop("done", None)
        return reply

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
    ) -> ExecResult:
        """Run a command to completion, streaming output to the callbacks as it arrives."""
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
        io_timeout = None if timeout is None else timeout + STREAM_GRACE
        conn = self._open(req, io_timeout, default_timeout=False)
        feeder: threading.Thread | None = None
        try:
            started, _ = conn.recv()
            if stdin is not None:
                feeder = threading.Thread(target=_feed_stdin, args=(conn, stdin), daemon=True)
                feeder.start()
            return _collect(conn, int(started["pid"]), max_output, on_stdout, on_stderr)
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
        return int(reply["pid"])

    def output(self, pid: int) -> ProcOutput:
        """Output buffered so far (the tail of max_output bytes per stream)."""
        conn = self._open({"op": "output", "pid": pid})
        out, err = bytearray(), bytearray()
        try:
            while True:
                obj, payload = conn.recv()
                if obj.get("done"):
                    break
                (out if obj.get("stream") == "stdout" else err).extend(payload)
        finally:
            conn.close()
        split = int(obj.get("stdout_len", 0))
        out += payload[:split]
        err += payload[split:]
        return ProcOutput(
            stdout=bytes(out),
            stderr=bytes(err),
            running=bool(obj["running"]),
            exit_code=obj.get("exit_code"),
            truncated=bool(obj.get("truncated")),
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
        io_timeout = None if timeout is None else timeout + STREAM_GRACE
        conn = self._open(
            {"op": "wait", "pid": pid, "timeout": timeout}, io_timeout, default_timeout=False
        )
        try:
            return _collect(conn, pid, max_output, on_stdout, on_stderr)
        finally:
            conn.close()

    def kill(self, pid: int, signal: int = 9) -> bool:
        """Signal the process group; False if the process had already finished."""
        return bool(self._call({"op": "kill", "pid": pid, "signal": signal})["killed"])

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
            conn.recv()
        finally:
            conn.close()

    def ps(self) -> list[dict[str, Any]]:
        return list(self._call({"op": "ps"})["processes"])

    def freeze(self) -> None:
        """Stop every process but the guest; new ones are refused until ``thaw``
        (the rootless engine's pause: no cgroup freezer without root)."""
        self._call({"op": "freeze"})

    def thaw(self) -> None:
        self._call({"op": "thaw"})

    # ------------------------------------------------------------ files
    def read(self, path: str, offset: int = 0, limit: int | None = None) -> Iterator[bytes]:
        """Stream a file in chunks. Errors such as not_found are raised here, at call time."""
        conn = self._open({"op": "read", "path": path, "offset": offset, "limit": limit})
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
        conn = self._open({"op": "write", "path": path, "mode": mode, "append": append})
        try:
            conn.recv()  # "ready": path checked before we send megabytes
            try:
                for chunk in _chunks(data):
                    conn.send({}, chunk)
                conn.send({"eof": True})
            except GuestUnavailableError as exc:
                conn.recv_after_send_failure(exc)
            obj, _ = conn.recv()
            return int(obj["size"])
        finally:
            conn.close()

    def list(self, path: str, depth: int = 1) -> list[dict[str, Any]]:
        return list(self._call({"op": "list", "path": path, "depth": depth})["entries"])

    def stat(self, path: str) -> dict[str, Any]:
        return dict(self._call({"op": "stat", "path": path})["entry"])

    def exists(self, path: str) -> bool:
        return bool(self._call({"op": "exists", "path": path})["exists"])

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
                self.size = int(obj.get("size", 0))
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
    code = obj.get("exit_code")
    return ExecResult(
        exit_code=-1 if code is None else int(code),
        stdout=bytes(out.buf),
        stderr=bytes(err.buf),
        timed_out=bool(obj.get("timed_out")),
        truncated=out.dropped or err.dropped or bool(obj.get("truncated")),
        pid=int(obj.get("pid", pid)),
    )


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
