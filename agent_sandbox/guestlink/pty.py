"""Terminals from the host's side of the guest: a live attachment over one guest
connection (``pty_create`` / ``pty_attach``), and the one-shot ``pty_kill``.

What the guest sends is hostile input: frames are bounded by ``guest_channel``, every field
read is type-checked, output only ever flows through to ``on_data`` (nothing is kept),
and a guest that stops answering holds nothing but this attachment's own reader thread,
which ``close`` frees.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.pty import (
    INPUT_CHUNK,
    DataCallback,
    PtySession,
    check_size,
    input_bytes,
)
from agent_sandbox.guest import ops
from agent_sandbox.guestlink.channel import GuestConnection, _shutdown, field
from agent_sandbox.guestlink.client import GuestClient

START_TIMEOUT = 30.0  # for the guest to start the program (or find it) and say so


def open_pty(client: GuestClient, req: dict[str, Any], on_data: DataCallback | None,
             kill: Callable[[int, int], bool]) -> GuestPty:
    """Send ``req`` (a pty_create or pty_attach) and return the attachment once the guest
    has answered; its errors (no such terminal, no such program) are raised here."""
    conn = client._open(req, START_TIMEOUT, frame_timeout=START_TIMEOUT)
    try:
        first, _ = conn.recv()
        pid = field(first, "pid", int)
        conn.limit(None, None)  # an idle terminal is not a stalled guest
    except BaseException:
        conn.close()
        raise
    return GuestPty(conn, pid, on_data, kill)


def pty_kill(client: GuestClient, pid: int, sig: int) -> bool:
    return bool(field(client._call({"op": ops.PTY_KILL, "pid": pid, "signal": sig}),
                      "killed", bool))


class GuestPty(PtySession):
    def __init__(self, conn: GuestConnection, pid: int, on_data: DataCallback | None,
                 kill: Callable[[int, int], bool]) -> None:
        super().__init__(pid, on_data)
        self._conn = conn
        self._kill = kill
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"abx-pty-{pid}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        code: int | None = None
        error: SandboxError | None = None
        try:
            while True:
                obj, payload = self._conn.recv()
                if obj.get("done"):
                    code = field(obj, "exit_code", int)
                    break
                if not self.deliver(payload):
                    break
        except SandboxError as exc:
            error = exc
        finally:
            self._conn.close()
            if self.closed and code is None:
                error = self.detached_error()
            self._end(code, error)

    def send_input(self, data: bytes | str) -> None:
        raw = input_bytes(data)
        self._check_open()
        with self._send_lock:
            for start in range(0, len(raw), INPUT_CHUNK):
                self._conn.send({}, raw[start:start + INPUT_CHUNK])

    def resize(self, cols: int, rows: int) -> None:
        cols, rows = check_size(cols, rows)
        self._check_open()
        with self._send_lock:
            self._conn.send({"resize": [cols, rows]})

    def kill(self, sig: int = 9) -> bool:
        """Signal the program (and its terminal's foreground job); False if it had ended."""
        if self._exit_code is not None:
            return False
        return self._kill(self.pid, int(sig))

    def close(self) -> None:
        """Detach: the program keeps running."""
        self.closed = True
        _shutdown(self._conn.sock)  # the reader thread closes the rest
        if threading.current_thread() is not self._reader:
            self._reader.join(5.0)
