"""``abx sandbox port`` through a gateway or the daemon: a local listener whose every
connection is carried over the gateway's WebSocket ``/v1/sandboxes/{id}/tcp/{port}``
(plain TCP as binary messages; an empty message is the client's EOF) to the port inside
the sandbox."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from agent_sandbox.core.errors import SandboxError
from agent_sandbox.remote.pty import connect_websocket


def tunnel(provider: Any, sandbox_id: str, port: int, local_port: int = 0) -> socket.socket:
    """Listen on 127.0.0.1:``local_port`` (0: any) and tunnel each connection; returns the
    listener (closing it stops accepting)."""
    listener = socket.create_server(("127.0.0.1", local_port))
    path = f"/v1/sandboxes/{sandbox_id}/tcp/{port}"

    def serve(client: socket.socket) -> None:
        try:
            ws, sock = connect_websocket(provider._http, path, f"port {port}")
        except SandboxError:
            client.close()
            return
        sock.settimeout(None)

        def back() -> None:
            with contextlib.suppress(Exception):
                for data in ws:
                    client.sendall(data if isinstance(data, bytes) else data.encode())
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_WR)

        reader = threading.Thread(target=back, daemon=True)
        reader.start()
        with contextlib.suppress(Exception):
            while data := client.recv(64 * 1024):
                ws.send(data)
            ws.send(b"")  # the client is done sending: an empty message is EOF
        reader.join()  # until the server inside is done too (the gateway then closes)
        with contextlib.suppress(Exception):
            ws.close()
        client.close()

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener
