"""One client connection of the guest (stdlib only)."""

from __future__ import annotations

import socket
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, BinaryIO, Dict, List, Optional

if __package__:
    from . import protocol as proto
    from .workers import Done
else:  # imported by agent.py from the guest's directory
    import protocol as proto  # type: ignore[no-redef]
    from workers import Done  # type: ignore[no-redef]


class Conn:
    """One client connection: socket, buffered reader, optional reader job."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile: BinaryIO = sock.makefile("rb")
        self.reader: Optional[Done] = None  # the job reading from the client, if any

    def send(self, obj: Dict[str, Any], payload: bytes = b"") -> None:
        proto.send_frame(self.sock, obj, payload)

    def send_parts(self, obj: Dict[str, Any], parts: List[bytes]) -> None:
        proto.send_frame_parts(self.sock, obj, parts)

    def done(self, **fields: Any) -> None:
        fields["done"] = True
        self.send(fields)

    def recv(self, what: str) -> proto.Frame:
        frame = proto.read_frame(self.rfile)
        if frame is None:
            raise ConnectionResetError(f"client closed the connection while sending {what}")
        return frame

    def close(self) -> None:
        """Half-close, then read until the client closes: avoids a TCP RST eating our reply."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            if self.reader is not None:
                self.reader.join(2.0)
            else:
                self.sock.settimeout(2.0)
                deadline = time.monotonic() + 2.0
                while time.monotonic() < deadline and self.sock.recv(65536):
                    pass
        except OSError:
            pass
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader thread still in recv
        except OSError:
            pass
        self.rfile.close()
        self.sock.close()
