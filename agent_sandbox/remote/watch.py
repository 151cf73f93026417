"""A directory watch through the gateway: its Server-Sent Events as ``FilesystemEvent``s
(the stream is described in ``agent_sandbox.surfaces.http.watch_relay``)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx

from agent_sandbox.core.errors import SandboxError, error_from_code
from agent_sandbox.core.models import FilesystemEvent

MAX_LINE = 1 << 20  # an event is a few KiB at most; a longer line is not the gateway's


def _lines(response: httpx.Response) -> Iterator[bytes]:
    """The body's lines, each at most MAX_LINE bytes."""
    pending = b""
    for chunk in response.iter_raw():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from lines
        if len(pending) > MAX_LINE:
            raise SandboxError("the gateway sent an overlong watch event")
    if pending:
        yield pending


def _messages(response: httpx.Response) -> Iterator[tuple[str, Any]]:
    """(event name, decoded data) of each message; comments (keepalives) are skipped."""
    name, data = "message", []
    for raw in _lines(response):
        line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
        if not line:
            if data:
                yield name, json.loads("\n".join(data))
            name, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)


class RemoteWatch:
    """Iterator of a gateway watch's events (see ``agent_sandbox.core.watch.WatchStream``)."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._messages = _messages(response)
        self._closed = threading.Event()
        self._reading = threading.Lock()
        self.ended: str | None = None
        self.backend = ""
        try:
            name, data = next(self._messages, ("", None))
            if name != "ready" or not isinstance(data, dict):
                raise SandboxError("the gateway did not start the watch")
            self.backend = str(data.get("backend", ""))
        except BaseException:
            response.close()
            raise

    def __iter__(self) -> RemoteWatch:
        return self

    def __next__(self) -> FilesystemEvent:
        with self._reading:
            if self.ended is not None:
                raise StopIteration
            try:
                return self._next()
            except StopIteration:
                raise
            except BaseException as exc:
                failed = not self._closed.is_set()
                self._end("failed" if failed else "stopped")
                if not failed:
                    raise StopIteration from None
                if isinstance(exc, SandboxError):
                    raise
                raise SandboxError(f"the watch broke: {exc!r}") from exc

    def _next(self) -> FilesystemEvent:
        for name, data in self._messages:
            if name == "message":
                return FilesystemEvent(**data)
            if name == "end":
                self._end(str(data.get("reason", "ended")))
                raise StopIteration
            if name == "error":
                self._end("failed")
                raise error_from_code(data.get("code", "internal"), data.get("message", ""),
                                      data.get("details"))
        raise SandboxError("the gateway ended the watch without saying why")

    def _end(self, why: str) -> None:
        self.ended = why
        self._response.close()

    def close(self) -> None:
        """Stop watching (from any thread): the gateway sees the connection go."""
        self._closed.set()
        stream = self._response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._reading.acquire(blocking=False):  # nobody reading: close it here
            try:
                if self.ended is None:
                    self._end("stopped")
            finally:
                self._reading.release()
