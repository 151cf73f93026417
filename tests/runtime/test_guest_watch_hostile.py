"""A guest's watch stream is hostile input: a socket server speaking the real framing
with forged events. Each case ends in ``GuestProtocolError`` with bounded memory, or is
read no faster than the host's rate."""

from __future__ import annotations

import os
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from agent_sandbox.guest import protocol as proto
from agent_sandbox.guestlink import watch as guest_watch
from agent_sandbox.guestlink.client import GuestClient, GuestProtocolError

Stream = Callable[[socket.socket], None]
STARTED = {"started": True, "backend": "inotify"}


@pytest.fixture
def liar() -> Iterator[Callable[[Stream], GuestClient]]:
    """liar(stream) -> a client of a 'guest' that answers a watch with started, then
    runs stream(conn)."""
    folder = tempfile.mkdtemp(prefix="abx-watch-liar-")
    servers: list[socket.socket] = []

    def start(stream: Stream) -> GuestClient:
        path = os.path.join(folder, f"g{len(servers)}.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(4)
        servers.append(srv)

        def serve() -> None:
            conn, _ = srv.accept()
            with conn:
                proto.read_frame(conn.makefile("rb"))
                try:
                    proto.send_frame(conn, STARTED)
                    stream(conn)
                except OSError:
                    pass  # the host hung up: what we want

        threading.Thread(target=serve, daemon=True).start()
        return GuestClient(path)

    yield start
    for srv in servers:
        srv.close()
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)


def _event(**fields: object) -> dict[str, object]:
    return {"type": "create", "path": "/w/f", "dir": False, **fields}


@pytest.mark.parametrize("bad", [
    [_event(type="explode")],
    [_event(path="relative")],
    [_event(path="/" + "x" * 5000)],
    [_event(path=7)],
    [_event(dir="yes")],
    [_event(type="rename")],  # no old_path
    [{"type": "overflow", "dropped": -1}],
    ["not an object"],
    [_event()] * 600,  # more than a frame may hold
])
def test_forged_events_end_the_watch(liar: Callable[[Stream], GuestClient],
                                     bad: list[object]) -> None:
    client = liar(lambda conn: (proto.send_frame(conn, {"events": bad}), time.sleep(5)))
    with pytest.raises(GuestProtocolError):
        list(client.watch("/w"))


def test_an_oversized_frame_is_refused_before_it_is_read(
        liar: Callable[[Stream], GuestClient]) -> None:
    def huge(conn: socket.socket) -> None:
        conn.sendall(struct.pack("!II", guest_watch.MAX_FRAME_JSON + 1, 0))
        time.sleep(5)

    watch = liar(huge).watch("/w")
    with pytest.raises(GuestProtocolError, match="exceeds limits"):
        next(watch)


def test_a_flood_is_read_no_faster_than_the_rate(liar: Callable[[Stream], GuestClient]
                                                 ) -> None:
    total = int(guest_watch.BURST + guest_watch.RATE)  # one second past the burst

    def flood(conn: socket.socket) -> None:
        batch = {"events": [_event(path=f"/w/f{i}") for i in range(500)]}
        for _ in range(total // 500):
            proto.send_frame(conn, batch)
        proto.send_frame(conn, {"done": True, "ended": "timeout"})

    watch = liar(flood).watch("/w")
    start = time.monotonic()
    events = list(watch)
    assert len(events) == total and watch.ended == "timeout"
    # A lower bound only: a loaded machine makes it slower, never faster.
    assert time.monotonic() - start >= 0.9


def test_close_from_another_thread_ends_a_quiet_watch(
        liar: Callable[[Stream], GuestClient]) -> None:
    watch = liar(lambda conn: time.sleep(30)).watch("/w")
    threading.Timer(0.2, watch.close).start()
    assert list(watch) == [] and watch.ended == "stopped"
