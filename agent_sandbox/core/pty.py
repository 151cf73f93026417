"""What ``Provider.pty_open`` hands back: one live attachment to a terminal (a program on
a pseudo-terminal) in a sandbox, whatever carries it (the guest's socket for the embedded
engine, a WebSocket for a gateway or the daemon).

The terminal's output goes to ``on_data`` (bytes, from a thread of the attachment) as it
comes; ``send_input`` types, ``resize`` resizes, ``kill`` signals it, ``wait`` returns
its exit code. ``close`` only detaches: the program keeps running and ``pty_open`` with
its pid attaches again (the recent output is replayed first).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from agent_sandbox.core.errors import (
    InvalidArgumentError,
    SandboxError,
    SandboxTimeoutError,
    WrongStateError,
)

DataCallback = Callable[[bytes], None]
MAX_SIZE = 9999  # columns or rows
INPUT_CHUNK = 64 << 10  # keystrokes go out in pieces of at most this much


def check_size(cols: object, rows: object) -> tuple[int, int]:
    for what, value in (("cols", cols), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
            raise InvalidArgumentError(f"{what} must be a whole number from 1 to {MAX_SIZE}, "
                                       f"got {value!r}")
    return int(cols), int(rows)  # type: ignore[call-overload]


def input_bytes(data: object) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise InvalidArgumentError(f"terminal input must be bytes or str, got {type(data).__name__}")


class PtySession:
    """The end of an attachment (exit code, or why it ended), its waiters and callbacks;
    carriers subclass it and call ``deliver`` and ``_end`` from their reader thread."""

    def __init__(self, pid: int, on_data: DataCallback | None) -> None:
        self.pid = pid
        self._on_data = on_data
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._exit_code: int | None = None
        self._error: SandboxError | None = None
        self._on_end: list[Callable[[], None]] = []
        self.closed = False  # detached on purpose

    @property
    def exit_code(self) -> int | None:
        """The program's exit code once it has ended (128+N: killed by signal N)."""
        return self._exit_code

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def deliver(self, data: bytes) -> bool:
        """Hand output to ``on_data``; False (and detached) if the callback raised."""
        if self._on_data is None or not data:
            return True
        try:
            self._on_data(data)
            return True
        except Exception as exc:  # noqa: BLE001 - the caller's code: reported by wait()
            error = SandboxError(f"on_data raised {exc!r}, so this client detached from "
                                 f"terminal {self.pid}; it keeps running (attach again with "
                                 f"pty.connect({self.pid}))")
            error.__cause__ = exc
            self._end(None, error)
            self.close()
            return False

    def detached_error(self) -> SandboxError:
        return WrongStateError(f"detached from terminal {self.pid}; it keeps running (attach "
                               f"again with pty.connect({self.pid}))")

    def _end(self, exit_code: int | None, error: SandboxError | None) -> None:
        with self._lock:
            if self._ended.is_set():
                return
            self._exit_code, self._error = exit_code, error
            self._ended.set()
            callbacks, self._on_end = self._on_end, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - one hook must not keep the others from running
                pass

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the attachment has ended (at once if it has)."""
        with self._lock:
            if not self._ended.is_set():
                self._on_end.append(callback)
                return
        callback()

    def wait(self, timeout: float | None = None) -> int:
        """Block until the program ends; its exit code. Raises what ended the attachment
        otherwise (detached, connection lost), or SandboxTimeoutError after ``timeout``."""
        if not self._ended.wait(timeout):
            raise SandboxTimeoutError(f"terminal {self.pid} is still running after "
                                      f"{timeout:g}s")
        if self._error is not None:
            raise self._error
        assert self._exit_code is not None
        return self._exit_code

    def _check_open(self) -> None:
        if self._ended.is_set():
            if self._exit_code is not None:
                raise WrongStateError(f"terminal {self.pid} has ended (exit code "
                                      f"{self._exit_code})")
            raise self._error or self.detached_error()

    # what carriers provide
    def send_input(self, data: bytes | str) -> None:
        raise NotImplementedError

    def resize(self, cols: int, rows: int) -> None:
        raise NotImplementedError

    def kill(self, sig: int = 9) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
