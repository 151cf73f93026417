"""A queue of a stream's events between the thread doing the work and the client, bounded
by the bytes of output the events carry as well as by their number: a count alone lets
each unread stream pin count x the largest event (32 x 1 MiB of a command's output)."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any

# What one stream may hold of events not yet sent: enough for a reader that keeps up
# (four of envd's 64 KiB output events), little for one that reads nothing (32 unread
# floods: 8 MiB): the work waits for room, and so does the sandbox's output.
MAX_EVENTS = 32
MAX_BYTES = 256 << 10


def event_size(event: Any) -> int:
    """The output an event carries: its text and bytes values (the rest is small)."""
    if not isinstance(event, dict):
        return 0
    return sum(len(v) for v in event.values() if isinstance(v, (str, bytes)))


class EventQueue:
    """FIFO; ``put`` waits while the queue is full (by count or by bytes). An event larger
    than ``max_bytes`` is let in once the queue is empty, so nothing waits forever."""

    def __init__(self, max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.held = 0  # bytes of the events queued
        self._items: deque[tuple[Any, int]] = deque()
        self._cond = threading.Condition(threading.Lock())

    def _full(self, size: int) -> bool:
        return bool(self._items) and (len(self._items) >= self.max_events
                                      or self.held + size > self.max_bytes)

    def put(self, item: Any, timeout: float | None = None) -> None:
        """Raises ``queue.Full`` if there is still no room after ``timeout`` seconds."""
        size = event_size(item)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._full(size):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise queue.Full
                self._cond.wait(left)
            self._items.append((item, size))
            self.held += size
            self._cond.notify_all()

    def put_nowait(self, item: Any) -> None:
        self.put(item, 0)

    def get(self) -> Any:
        with self._cond:
            while not self._items:
                self._cond.wait()
            item, size = self._items.popleft()
            self.held -= size
            self._cond.notify_all()
            return item

    def qsize(self) -> int:
        with self._cond:
            return len(self._items)
