"""The host end of a guest ``watch``: a directory's changes as ``FilesystemEvent``s.

What the guest sends is hostile input. Each frame is small (``MAX_FRAME_JSON``), holds a
bounded batch of events, each field type-checked and length-capped; and the events are
read no faster than ``RATE`` a second (bursts of ``BURST``): a sandbox making millions of
files gets its socket's buffer full, so its own kernel queue overflows (reported as an
``overflow`` event), instead of the host spending its CPU on them. Nothing is queued
here beyond one frame.
"""

from __future__ import annotations

import posixpath
import threading
import time
from collections import deque
from typing import Any

from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.models import WATCH_EVENT_TYPES, FilesystemEvent
from agent_sandbox.guestlink.channel import (
    GuestConnection,
    GuestProtocolError,
    field,
)

MAX_FRAME_JSON = 1 << 20
MAX_BATCH = 512  # events per frame (the guest sends at most 256)
MAX_PATH = 4096
MAX_MESSAGE = 300
RATE = 10000.0  # events a second, sustained
BURST = 20000.0
BACKENDS = ("inotify", "poll")


def _path(raw: dict[str, Any], key: str) -> str:
    value = field(raw, key, str)
    if not value.startswith("/") or len(value) > MAX_PATH or "\x00" in value:
        raise GuestProtocolError(f"the guest sent an invalid event {key}: {value[:80]!r}")
    return value


def _relative(root: str, path: str) -> str:
    if root == "/":
        return path.lstrip("/")
    if path.startswith(root + "/"):
        return path[len(root) + 1:]
    return posixpath.relpath(path, root)


def parse_event(raw: Any, root: str) -> FilesystemEvent:
    """One event as the guest sent it, checked."""
    if not isinstance(raw, dict):
        raise GuestProtocolError("the guest sent an event that is not an object")
    kind = field(raw, "type", str)
    if kind not in WATCH_EVENT_TYPES:
        raise GuestProtocolError(f"the guest sent an unknown event type {kind[:40]!r}")
    if kind == "overflow":
        dropped = field(raw, "dropped", (int, type(None)), None)
        if dropped is not None and dropped < 0:
            raise GuestProtocolError("the guest sent a negative dropped count")
        return FilesystemEvent(type="overflow", dropped=dropped,
                               message=field(raw, "message", str, "")[:MAX_MESSAGE])
    path = _path(raw, "path")
    old = _path(raw, "old_path") if kind == "rename" else None
    return FilesystemEvent(type=kind, path=path, name=_relative(root, path), old_path=old,
                           is_dir=field(raw, "dir", bool, False))


class GuestWatch:
    """Iterator of a guest watch's events (see ``agent_sandbox.core.watch.WatchStream``)."""

    def __init__(self, conn: GuestConnection, root: str) -> None:
        self._conn = conn
        self.root = "/" + posixpath.normpath(root).lstrip("/")  # as the guest has it
        self.ended: str | None = None
        self._batch: deque[FilesystemEvent] = deque()
        self._closed = threading.Event()
        self._reading = threading.Lock()
        self._tokens = BURST
        self._refilled = time.monotonic()
        conn.max_json = MAX_FRAME_JSON
        try:
            started, _ = conn.recv()  # the watches are in place, or the guest's error
            self.backend: str = field(started, "backend", str)
            if self.backend not in BACKENDS or started.get("started") is not True:
                raise GuestProtocolError("the guest did not start the watch properly")
            conn.limit(None, None)  # a watched directory may stay quiet for hours
        except BaseException:
            conn.close()
            raise

    def __iter__(self) -> GuestWatch:
        return self

    def __next__(self) -> FilesystemEvent:
        while not self._batch:
            self._fill()
        return self._batch.popleft()

    def _fill(self) -> None:
        with self._reading:
            if self.ended is not None:
                raise StopIteration
            self._receive()

    def _receive(self) -> None:
        try:
            obj, payload = self._conn.recv()
        except SandboxError:
            if self._closed.is_set():
                self._end("stopped")
                raise StopIteration from None
            self._end("failed")
            raise
        if obj.get("done"):
            self._end(field(obj, "ended", str, "ended")[:MAX_MESSAGE])
            raise StopIteration
        events = field(obj, "events", list)
        if payload or len(events) > MAX_BATCH:
            self._end("failed")
            raise GuestProtocolError("the guest sent an oversized batch of watch events")
        try:
            self._batch.extend(parse_event(raw, self.root) for raw in events)
        except GuestProtocolError:
            self._end("failed")
            raise
        self._throttle(len(events))

    def _throttle(self, count: int) -> None:
        now = time.monotonic()
        self._tokens = min(BURST, self._tokens + (now - self._refilled) * RATE) - count
        self._refilled = now
        if self._tokens < 0:
            self._closed.wait(-self._tokens / RATE)

    def _end(self, why: str) -> None:
        self.ended = why
        self._conn.close()

    def close(self) -> None:
        """Stop watching (from any thread): the guest ends its watch, iteration ends."""
        self._closed.set()
        self._conn.shutdown()
        if self._reading.acquire(blocking=False):  # nobody reading: close it here
            try:
                if self.ended is None:
                    self._end("stopped")
            finally:
                self._reading.release()
