"""A directory watch between its parts: the stream a provider hands out
(``Provider.watch_dir``) and the bounded queue wherever events wait for a reader (the
SDK's ``WatchHandle``, the gateway's relay to a client).

Events come from inside a sandbox, which can make them as fast as it can create files:
no part holds more than a fixed number (and size) of them. A queue that is full drops
what comes until it is half empty again, then says so with one ``overflow`` event, at
the place of the loss, carrying how many were dropped.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from agent_sandbox.core.models import FilesystemEvent

MAX_WATCH_TIMEOUT = 7 * 86400  # seconds a watch may be given to run (None: no end)


@runtime_checkable
class WatchStream(Protocol):
    """Events of one watch, as they happen. Iterating blocks until the next event; it
    ends when the watch ends (``ended`` says why) and raises the error that broke it.
    ``close()`` may be called from any thread: the watch stops, iteration ends."""

    backend: str
    ended: str | None

    def __iter__(self) -> Iterator[FilesystemEvent]: ...
    def __next__(self) -> FilesystemEvent: ...
    def close(self) -> None: ...


def event_size(event: FilesystemEvent) -> int:
    """What an event costs to hold, roughly, in bytes."""
    return 200 + len(event.path) + len(event.name) + len(event.old_path or "") + \
        len(event.message)


class EventQueue:
    """A bounded FIFO of events for one reader; ``put`` never blocks."""

    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._items: deque[FilesystemEvent] = deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._lost = 0  # dropped since the last overflow event went in
        self._lost_unknown = False  # ...and some of them uncounted (the kernel's)
        self._finished = False
        self.dropped_total = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def _fits(self, size: int) -> bool:
        return len(self._items) < self.max_events and self._bytes + size <= self.max_bytes

    def _drained(self) -> bool:
        """Down to half: a queue that overflowed takes events again (after saying what
        it lost) only from here, so a flood makes one overflow event per gap, not one
        every other event."""
        return len(self._items) <= self.max_events // 2 and self._bytes <= self.max_bytes // 2

    def _append(self, event: FilesystemEvent) -> None:
        self._items.append(event)
        self._bytes += event_size(event)
        self._cond.notify_all()

    def _lose(self, event: FilesystemEvent) -> None:
        if event.type == "overflow":
            self._lost += event.dropped or 0
            self._lost_unknown |= event.dropped is None
        else:
            self._lost += 1
            self.dropped_total += 1

    def _losing(self) -> bool:
        return bool(self._lost or self._lost_unknown)

    def _report_loss(self) -> None:
        """Put the overflow event for what was dropped (``put`` takes events again)."""
        count = None if self._lost_unknown else self._lost
        self._append(FilesystemEvent(
            type="overflow", dropped=count,
            message=f"events came faster than they were read: {self._lost} dropped"
                    + (" (and more, uncounted)" if self._lost_unknown else "")))
        self._lost, self._lost_unknown = 0, False

    def put(self, event: FilesystemEvent) -> None:
        with self._cond:
            if self._finished:
                return
            if self._losing() and self._drained():
                self._report_loss()
            if self._losing() or not self._fits(event_size(event)):
                self._lose(event)
                return
            self._append(event)

    def finish(self) -> None:
        """No more events: readers get what is queued (and the loss), then the end."""
        with self._cond:
            if not self._finished:
                if self._losing():
                    self._report_loss()  # even past the bound: one event
                self._finished = True
            self._cond.notify_all()

    @property
    def finished(self) -> bool:
        """Finished, and everything queued was taken."""
        with self._cond:
            return self._finished and not self._items

    def _pop(self) -> FilesystemEvent:
        event = self._items.popleft()
        self._bytes -= event_size(event)
        if self._losing() and self._drained():
            self._report_loss()
        return event

    def get(self, timeout: float | None = None) -> FilesystemEvent | None:
        """The next event; None if none came within ``timeout`` or the queue is finished
        and empty."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._items:
                if self._finished:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            return self._pop()

    def drain(self, limit: int | None = None) -> list[FilesystemEvent]:
        """What is queued now (at most ``limit``), without waiting."""
        with self._cond:
            out = []
            while self._items and (limit is None or len(out) < limit):
                out.append(self._pop())
            return out
