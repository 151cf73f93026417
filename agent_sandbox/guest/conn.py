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
    """One client connection: socket, buffered reader, optional reader job.

    ``lost`` says the connection itself failed (a send or receive raised, or the client
    closed it mid-request): an OSError a handler lets out is then the connection's, and
    nothing can be told to the client; otherwise it is the handler's own (a file's, a
    process's) and is answered as an error."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile: BinaryIO = sock.makefile("rb")
        self.reader: Optional[Done] = None  # the job reading from the client, if any
        self.lost = False

    def send(self, obj: Dict[str, Any], payload: bytes = b"") -> None:
        try:
            proto.send_frame(self.sock, obj, payload)
        except OSError:
            self.lost = True  # maybe part of a frame went out: no reply can follow it
            raise

    def send_parts(self, obj: Dict[str, Any], parts: List[bytes]) -> None:
        try:
            proto.send_frame_parts(self.sock, obj, parts)
        except OSError:
            self.lost = True
            raise

    def done(self, **fields: Any) -> None:
        fields["done"] = True
        self.send(fields)

    def read(self) -> Optional[proto.Frame]:
        """The client's next frame; None when it closed the connection between frames."""
        try:
            return proto.read_frame(self.rfile)
        except OSError:
            self.lost = True
            raise

    def recv(self, what: str) -> proto.Frame:
        frame = self.read()
        if frame is None:
            self.lost = True
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
