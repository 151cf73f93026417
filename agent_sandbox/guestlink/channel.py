"""The host end of one guest connection: connecting, framing, deadlines, caps.

The guest runs inside the sandbox, so everything it says is hostile input: frames are
capped (``MAX_REPLY_JSON``), a call has an overall deadline as well as a per-frame one, a
call collects a bounded number of frames (``MAX_CALL_FRAMES``), error texts are cut
(``MAX_ERROR_TEXT``), and every field read is type-checked (``field``). A guest that
breaks these rules gets ``GuestProtocolError``, never a pinned thread, a grown host
process or a stray exception.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from agent_sandbox.core import cancel
from agent_sandbox.core.errors import (
    CancelledCallError,
    RuntimeUnavailableError,
    SandboxError,
    SandboxTimeoutError,
    error_from_code,
)
from agent_sandbox.guest import protocol as proto

Address = str | tuple[str, int]
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


# What a guest may answer: the codes of its own failures. Others (unauthenticated,
# permission_denied) speak for the gateway to its caller (a 401 signs the console out
# and leaves the call unaudited): from a guest they are its internal errors.
GUEST_CODES = frozenset({"invalid_argument", "not_found", "wrong_state", "timeout",
                         "resource_exhausted", "runtime_unavailable", "internal",
                         "cancelled", "locked", "conflict"})
MAX_DETAILS = 8  # fields of an error's details kept (scalars; texts cut to MAX_DETAIL_TEXT)
MAX_DETAIL_TEXT = 200


def error_details(raw: Any) -> dict[str, Any] | None:
    """An error's details as the guest sent them, kept only as a few short scalars: they
    reach clients (a lock's holder, a file's version), so nothing large or nested."""
    if not isinstance(raw, dict):
        return None
    kept: dict[str, Any] = {}
    for key, value in list(raw.items())[:MAX_DETAILS]:
        if not isinstance(key, str) or len(key) > 40:
            continue
        if isinstance(value, str):
            kept[key] = value[:MAX_DETAIL_TEXT]
        elif value is None or isinstance(value, bool) or (
                isinstance(value, (int, float)) and math.isfinite(value)
                and abs(value) < 1 << 53):
            kept[key] = value
    return kept


def connect(address: Address, connect_timeout: float, what: str) -> GuestConnection:
    """A connection to the guest at ``address`` (a unix socket path, or host and port)
    for the call named ``what``."""
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        sock = socket.socket(
            socket.AF_INET6 if ":" in address[0] else socket.AF_INET, socket.SOCK_STREAM
        )
    deadline = time.monotonic() + connect_timeout
    while True:
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.connect(address)
            break
        except BlockingIOError as exc:
            # A unix socket's full backlog (a burst of calls to one sandbox) answers EAGAIN
            # at once instead of waiting: wait for room until the connect timeout.
            if time.monotonic() < deadline:
                time.sleep(0.002)
                continue
            sock.close()
            raise GuestUnavailableError(
                f"cannot connect to the guest agent at {address!r}: its queue stayed full"
            ) from exc
        except OSError as exc:
            sock.close()
            raise GuestUnavailableError(
                f"cannot connect to the guest agent at {address!r}: {exc}"
            ) from exc
    if not isinstance(address, str):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return GuestConnection(sock, what, cancel.current())


class GuestConnection:
    """One connection to the guest; errors become SandboxError subclasses.

    ``deadline`` (monotonic) ends the whole call however steadily the guest sends;
    the socket timeout bounds each frame."""

    def __init__(self, sock: socket.socket, what: str,
                 call: cancel.CallCancel | None = None) -> None:
        self.sock = sock
        self.rfile: BinaryIO = sock.makefile("rb")
        self.what = what
        self.deadline: float | None = None
        self.frame_timeout: float | None = None
        self.max_json = MAX_REPLY_JSON  # a call expecting small frames lowers it
        # A cancelled call shuts the connection down: the guest kills a foreground command.
        self._call = call
        self._call_key = None if call is None else call.register(lambda: _shutdown(sock))

    def _broken(self, what: str) -> SandboxError:
        if self._call is not None and self._call.cancelled:
            return CancelledCallError(f"{self.what} was cancelled; what it started was stopped")
        return GuestUnavailableError(what)

    def limit(self, frame_timeout: float | None, total: float | None) -> None:
        self.frame_timeout = frame_timeout
        self.deadline = None if total is None else time.monotonic() + total
        self.sock.settimeout(frame_timeout)

    def send(self, obj: dict[str, Any], payload: bytes = b"") -> None:
        try:
            proto.send_frame(self.sock, obj, payload)
        except OSError as exc:
            raise self._broken(f"guest connection lost during {self.what}: {exc}") from exc

    def recv(self) -> tuple[dict[str, Any], bytes]:
        """Next frame; raises the guest's error if it is an error frame."""
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise SandboxTimeoutError(f"guest did not finish {self.what} in time")
            self.sock.settimeout(left if self.frame_timeout is None
                                 else min(left, self.frame_timeout))
        try:
            frame = proto.read_frame(self.rfile, self.max_json)
        except TimeoutError as exc:
            raise SandboxTimeoutError(f"guest did not answer {self.what} in time") from exc
        except proto.TruncatedFrame as exc:
            # A connection cut mid-frame is a broken connection, not a lying guest: a
            # cancelled call shuts its own end down while a large output frame is on its
            # way, and that must not stop the sandbox (with every process in it).
            raise self._broken(f"guest connection broke during {self.what}: {exc}") from None
        except (proto.ProtocolError, RecursionError, MemoryError) as exc:
            raise GuestProtocolError(f"guest sent an invalid frame during {self.what}: "
                                     f"{str(exc)[:200]}") from None
        except OSError as exc:
            raise self._broken(f"guest connection broke during {self.what}: {exc}") from exc
        if frame is None:
            raise self._broken(f"guest closed the connection during {self.what}")
        err = frame[0].get("error")
        if err:
            if not isinstance(err, dict):
                raise GuestProtocolError(f"guest sent an invalid error during {self.what}")
            code = err.get("code")
            raise error_from_code(code if code in GUEST_CODES else "internal",
                                  str(err.get("message", "guest error"))[:MAX_ERROR_TEXT],
                                  error_details(err.get("details")))
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

    def final(self) -> dict[str, Any]:
        """The reply's final frame; a guest that keeps sending others is cut off."""
        for _ in range(MAX_CALL_FRAMES):
            obj, _ = self.recv()
            if obj.get("done"):
                return obj
        raise GuestProtocolError(f"guest sent too many frames for {self.what}")

    def shutdown(self) -> None:
        """End the connection from another thread: a blocked ``recv`` returns."""
        _shutdown(self.sock)

    def close(self) -> None:
        if self._call is not None and self._call_key is not None:
            self._call.unregister(self._call_key)
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

    def bind(self, sock: socket.socket) -> None:
        """The call's connection, once made: shut down at once if already cancelled."""
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


def payload_chunks(
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
        yield from payload_chunks(bytes(item))


def guest_listener(path: str) -> socket.socket:
    """A fresh listener at ``path`` (a host-only directory), 0600: where a sandbox's
    guest is handed its connection (runc and memory backends alike)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener
