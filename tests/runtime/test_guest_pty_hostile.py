"""A terminal attachment against a guest that lies: everything it sends is hostile.

The lying guest is a socket server speaking the real framing with forged frames. Each
case must end in bounded time with ``GuestProtocolError`` (or a timeout), with nothing
of what it sent piling up in the host process.
"""

from __future__ import annotations

import os
import resource
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from agent_sandbox.core.errors import SandboxTimeoutError, WrongStateError
from agent_sandbox.guest import protocol as proto
from agent_sandbox.guestlink import pty as guest_pty
from agent_sandbox.guestlink.client import GuestClient, GuestProtocolError

Reply = Callable[[socket.socket], None]


@pytest.fixture
def liar() -> Iterator[Callable[[Reply], GuestClient]]:
    """liar(reply) -> a client of a 'guest' that answers every request with reply()."""
    folder = tempfile.mkdtemp(prefix="abx-ptyliar-")
    servers: list[socket.socket] = []

    def start(reply: Reply) -> GuestClient:
        path = os.path.join(folder, f"g{len(servers)}.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(8)
        servers.append(srv)

        def handle(conn: socket.socket) -> None:
            with conn:
                proto.read_frame(conn.makefile("rb"))
                try:
                    reply(conn)
                except OSError:
                    pass  # the client hung up: what we want

        def serve() -> None:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                threading.Thread(target=handle, args=(conn,), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        return GuestClient(path)

    yield start
    for srv in servers:
        srv.close()
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)


def _open(client: GuestClient, on_data: Callable[[bytes], None] | None = None
          ) -> guest_pty.GuestPty:
    return guest_pty.open_pty(client, {"op": "pty_create"}, on_data, lambda pid, sig: False)


def _started(conn: socket.socket) -> None:
    proto.send_frame(conn, {"started": True, "pid": 42})


def test_a_forged_pid_is_refused(liar: Callable[[Reply], GuestClient]) -> None:
    client = liar(lambda conn: proto.send_frame(conn, {"started": True, "pid": "42; rm"}))
    with pytest.raises(GuestProtocolError, match="'pid'"):
        _open(client)


def test_a_forged_exit_code_is_refused(liar: Callable[[Reply], GuestClient]) -> None:
    def reply(conn: socket.socket) -> None:
        _started(conn)
        proto.send_frame(conn, {"done": True, "exit_code": True})

    with pytest.raises(GuestProtocolError, match="'exit_code'"):
        _open(liar(reply)).wait(10)


def test_an_oversized_frame_ends_the_attachment(liar: Callable[[Reply], GuestClient]) -> None:
    def reply(conn: socket.socket) -> None:
        _started(conn)
        conn.sendall(struct.pack("!II", 2, proto.MAX_BIN + 1) + b"{}")
        time.sleep(5)

    with pytest.raises(GuestProtocolError, match="invalid frame"):
        _open(liar(reply)).wait(10)


def test_a_silent_guest_times_out_at_start(liar: Callable[[Reply], GuestClient],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guest_pty, "START_TIMEOUT", 0.5)
    started = time.monotonic()
    with pytest.raises(SandboxTimeoutError):
        _open(liar(lambda conn: time.sleep(10)))
    assert time.monotonic() - started < 5


def test_a_silent_terminal_is_left_by_close(liar: Callable[[Reply], GuestClient]) -> None:
    def reply(conn: socket.socket) -> None:
        _started(conn)
        time.sleep(30)

    term = _open(liar(reply))
    started = time.monotonic()
    term.close()
    with pytest.raises(WrongStateError, match="detached"):
        term.wait(5)
    assert time.monotonic() - started < 5


def test_endless_output_is_passed_on_not_kept(liar: Callable[[Reply], GuestClient]) -> None:
    """256 MiB of output in 4 MiB frames: every byte reaches on_data, none is kept."""
    frame = os.urandom(proto.MAX_BIN)
    count = 64

    def reply(conn: socket.socket) -> None:
        _started(conn)
        for _ in range(count):
            proto.send_frame(conn, {"stream": "pty"}, frame)
        proto.send_frame(conn, {"done": True, "exit_code": 0})

    seen = [0]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    term = _open(liar(reply), lambda data: seen.__setitem__(0, seen[0] + len(data)))
    assert term.wait(60) == 0
    assert seen[0] == count * len(frame)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 64, f"the host grew by {grown_mib:.0f} MiB"
