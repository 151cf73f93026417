"""Ports: a server listening inside a sandbox, reached from the host through the guest
channel (never through the sandbox's network, which may be off).

Each exposed (sandbox, port) gets a listener on the host's 127.0.0.1 (a kernel-chosen
port); each connection to it becomes one guest connection (``port_connect``) carrying the
bytes both ways. What comes back is the sandbox's and only relayed, never parsed; each
relay is two threads with fixed buffers, and a sandbox has at most ``MAX_CONNECTIONS``
at once, so a stalled or flooding sandbox costs only its own connections.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from agent_sandbox.core import validate
from agent_sandbox.core.errors import SandboxError
from agent_sandbox.guest import ops
from agent_sandbox.guestlink.channel import GuestConnection
from agent_sandbox.guestlink.client import GuestClient

MAX_CONNECTIONS = 256  # per sandbox, at once
_CHUNK = 256 * 1024
_CONNECT_TIMEOUT = 15.0  # for the guest to answer: a server that accepts, or an error
# After the client has finished sending (most often: closed), how long the server inside
# may stay silent before the connection is dropped: a keep-alive server would otherwise
# hold the sandbox's connection slot for as long as it likes.
HALF_CLOSED_IDLE = 30.0


class _Forward:
    """One exposed port: its listener and accept thread."""

    def __init__(self, sandbox_id: str, port: int, guest: Callable[[], GuestClient],
                 slots: threading.BoundedSemaphore) -> None:
        self.sandbox_id, self.port, self._guest, self._slots = sandbox_id, port, guest, slots
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name=f"abx-port-{sandbox_id}-{port}",
                         daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                client.close()  # over the cap: refused at once
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True,
                             name=f"abx-port-{self.sandbox_id}-{self.port}-conn").start()

    def _serve(self, client: socket.socket) -> None:
        conn: GuestConnection | None = None
        try:
            conn = self._guest()._open({"op": ops.PORT_CONNECT, "port": self.port},
                                       _CONNECT_TIMEOUT, frame_timeout=_CONNECT_TIMEOUT)
            conn.recv()  # {"connected": true}, or the guest's error raised
            conn.limit(None, None)  # an idle connection is not a stalled guest
            _splice(client, conn)
        except (SandboxError, OSError):
            pass  # nothing listens there, the sandbox went: the client sees the close
        finally:
            if conn is not None:
                conn.close()
            client.close()
            self._slots.release()


def _splice(client: socket.socket, conn: GuestConnection) -> None:
    """Client → guest here, guest → client in a second thread; ends when both have."""

    def from_guest() -> None:
        try:
            # read1: bytes the frame reader already buffered come first
            while data := conn.rfile.read1(_CHUNK):  # type: ignore[attr-defined]
                client.sendall(data)
        except (OSError, ValueError):
            pass
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)

    back = threading.Thread(target=from_guest, daemon=True)
    back.start()
    try:
        while data := client.recv(_CHUNK):
            conn.sock.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        conn.sock.settimeout(HALF_CLOSED_IDLE)
        conn.sock.shutdown(socket.SHUT_WR)
    back.join()


class PortForwards:
    """Every exposed port of one engine; a sandbox's end with it (``close``)."""

    def __init__(self, guest: Callable[[str], GuestClient]) -> None:
        self._guest = guest
        self._lock = threading.Lock()
        self._forwards: dict[tuple[str, int], _Forward] = {}
        self._slots: dict[str, threading.BoundedSemaphore] = {}

    def expose(self, sandbox_id: str, port: int) -> str:
        """``127.0.0.1:N`` reaching ``port`` inside the sandbox (the same for the same port)."""
        port = validate.port(port)
        with self._lock:
            forward = self._forwards.get((sandbox_id, port))
            if forward is None:
                slots = self._slots.setdefault(sandbox_id,
                                               threading.BoundedSemaphore(MAX_CONNECTIONS))
                forward = _Forward(sandbox_id, port, lambda: self._guest(sandbox_id), slots)
                self._forwards[(sandbox_id, port)] = forward
            return forward.address

    def close(self, sandbox_id: str | None = None) -> None:
        """Stop forwarding one sandbox's ports (None: every sandbox's)."""
        with self._lock:
            gone = [k for k in self._forwards if sandbox_id is None or k[0] == sandbox_id]
            for key in gone:
                self._forwards.pop(key).close()
            if sandbox_id is None:
                self._slots.clear()
            else:
                self._slots.pop(sandbox_id, None)
