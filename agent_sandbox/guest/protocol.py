"""Wire framing shared by the guest agent and the host client (stdlib only).

A frame is ``struct.pack("!II", json_len, bin_len)``, then ``json_len`` bytes of UTF-8
JSON (an object), then ``bin_len`` raw bytes. This module must stay importable by the
guest running as a plain script on any python3 >= 3.9, so it imports nothing else.
"""

from __future__ import annotations

import json
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:  # keep typing (slow to import) out of the guest's startup
    from typing import Any, BinaryIO, Dict, List, Optional, Tuple

    Frame = Tuple[Dict[str, Any], bytes]

VERSION = 1
HEADER = struct.Struct("!II")
MAX_JSON = 16 << 20
MAX_BIN = 4 << 20
CHUNK = 1 << 20  # preferred payload size for file and stdin streams
# Below this size header, JSON and payload go out in one send (one syscall, no Nagle gap).
_COALESCE = 64 << 10

_dumps = json.JSONEncoder(separators=(",", ":")).encode


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the connection must be closed."""


class TruncatedFrame(ProtocolError):
    """The connection ended part way through a frame: a broken connection (a peer gone,
    or our own end shut down to cancel the call), not a malformed frame."""


def encode_json(obj: Any) -> bytes:
    return _dumps(obj).encode("utf-8")


def _head(obj: Dict[str, Any], size: int) -> bytes:
    """Header + JSON of a frame whose payload is ``size`` bytes, after the size caps."""
    data = encode_json(obj)
    if len(data) > MAX_JSON or size > MAX_BIN:
        raise ProtocolError(f"frame too large: json={len(data)} bin={size}")
    return HEADER.pack(len(data), size) + data


def encode_frame(obj: Dict[str, Any], payload: bytes = b"") -> Tuple[bytes, bytes]:
    """Return (header + JSON, payload) after checking the size caps."""
    return _head(obj, len(payload)), payload


def send_frame(sock: Any, obj: Dict[str, Any], payload: bytes = b"") -> None:
    """Send one frame on a connected socket (blocking, whole frame)."""
    head, payload = encode_frame(obj, payload)
    if len(payload) <= _COALESCE:
        sock.sendall(head + payload if payload else head)
    else:
        sock.sendall(head)
        sock.sendall(payload)


def send_frame_parts(sock: Any, obj: Dict[str, Any], parts: List[bytes]) -> None:
    """One frame whose payload is ``parts`` back to back, sent without joining them: a
    slow reader's backlog is not held twice over while it is sent."""
    size = sum(len(part) for part in parts)
    if size <= _COALESCE:
        send_frame(sock, obj, b"".join(parts))
        return
    sock.sendall(_head(obj, size))
    for part in parts:
        sock.sendall(part)


def _read_exact(rfile: BinaryIO, n: int, what: str) -> bytes:
    data = rfile.read(n) if n else b""
    if data is None or len(data) != n:
        raise TruncatedFrame(f"connection closed in the middle of a frame ({what})")
    return data


def read_frame(rfile: BinaryIO, max_json: int = MAX_JSON) -> Optional[Frame]:
    """Read one frame from a buffered binary file; None on a clean EOF between frames.
    ``max_json`` lets a reader that trusts its peer less take less."""
    head = rfile.read(HEADER.size)
    if not head:
        return None
    if len(head) != HEADER.size:
        raise TruncatedFrame("connection closed in the middle of a frame header")
    json_len, bin_len = HEADER.unpack(head)
    if json_len > min(max_json, MAX_JSON) or bin_len > MAX_BIN:
        raise ProtocolError(f"frame exceeds limits: json={json_len} bin={bin_len}")
    raw = _read_exact(rfile, json_len, "json")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"frame is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("frame JSON must be an object")
    return obj, _read_exact(rfile, bin_len, "payload")
