"""The streams of a guest call: command output coming in (kept as bounded tails), a
file's chunks coming in, stdin going out."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from agent_sandbox.core.errors import SandboxError
from agent_sandbox.guestlink.channel import (
    GuestConnection,
    GuestProtocolError,
    field,
    payload_chunks,
)

OutputCallback = Callable[[bytes], None]


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


class OutputTail:
    """Keeps the last ``cap`` bytes of a stream and remembers whether it dropped any.

    The frames are kept as they came, not copied into one growing buffer: a bytearray
    trimmed from the front after each 1 MiB frame held ~2.3 MiB a stream (a gateway
    following 32 unread floods grew ~75 MiB for tails of 1 MiB)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.dropped = False

    def add(self, data: bytes) -> None:
        if not data:
            return
        self.chunks.append(data)
        self.size += len(data)
        while self.size > self.cap:
            over, first = self.size - self.cap, self.chunks[0]
            if len(first) <= over:
                self.chunks.popleft()
                self.size -= len(first)
            else:
                self.chunks[0] = first[over:]
                self.size -= over
            self.dropped = True

    @property
    def buf(self) -> bytes:
        return b"".join(self.chunks)


MAX_VERSION = 100  # characters of a file version the guest may send


def _version(obj: dict[str, Any]) -> str | None:
    value = field(obj, "version", (str, type(None)), None)
    if value is not None and not 0 < len(value) <= MAX_VERSION:
        raise GuestProtocolError(f"the guest sent an invalid version: {value[:80]!r}")
    return value


class ReadStream(Iterator[bytes]):
    """Iterator over read() chunks that owns (and always closes) its connection."""

    def __init__(self, conn: GuestConnection, first: tuple[dict[str, Any], bytes]) -> None:
        self._conn: GuestConnection | None = conn
        self._pending: tuple[dict[str, Any], bytes] | None = first
        self.size: int | None = None  # bytes sent, known once exhausted
        # The file's version (a read's first frame): what a conditional write names.
        self.version: str | None = _version(first[0])

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

    def __enter__(self) -> ReadStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def collect_output(
    conn: GuestConnection,
    pid: int,
    max_output: int,
    on_stdout: OutputCallback | None,
    on_stderr: OutputCallback | None,
) -> ExecResult:
    """Read output frames (firing callbacks live) until the final frame."""
    out, err = OutputTail(max_output), OutputTail(max_output)
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


def feed_stdin(conn: GuestConnection, data: bytes | Iterable[bytes]) -> None:
    """Runs in a thread so output callbacks keep firing while stdin is produced."""
    try:
        for chunk in payload_chunks(data):
            conn.send({}, chunk)
        conn.send({"eof": True})
    except (SandboxError, OSError, ValueError):
        pass  # the command ended or the connection closed; the reader reports it
