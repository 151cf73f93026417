"""A 'guest' that lies: a unix socket server speaking the real framing with forged
replies, for the tests of what the host does with hostile guest answers."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from agent_sandbox.guest import protocol as proto

Reply = Callable[[socket.socket, dict], None]


@contextmanager
def lying_guests() -> Iterator[Callable[[Reply], str]]:
    """start(reply) -> socket path of a 'guest' answering every request with reply(conn,
    request); the servers and their sockets are gone on exit."""
    folder = tempfile.mkdtemp(prefix="abx-liar-")
    servers: list[socket.socket] = []

    def start(reply: Reply) -> str:
        path = os.path.join(folder, f"g{len(servers)}.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(8)
        servers.append(srv)

        def serve() -> None:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                threading.Thread(target=handle, args=(conn,), daemon=True).start()

        def handle(conn: socket.socket) -> None:
            with conn:
                frame = proto.read_frame(conn.makefile("rb"))
                try:
                    reply(conn, frame[0] if frame else {})
                except OSError:
                    pass  # the client hung up: what we want

        threading.Thread(target=serve, daemon=True).start()
        return path

    try:
        yield start
    finally:
        for srv in servers:
            srv.close()
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)
