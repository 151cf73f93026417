"""The host end of a kernel bridge (``guest/kernel_bridge.py``): hostile lines in, bounded.

The bridge runs inside the sandbox as a foreground exec with stdin open, on a thread of
ours; its stdout arrives through the guest's bounded frames and is split here into lines
of at most ``MAX_EVENT`` bytes, each parsed and shape-checked before anyone sees it.
What is not yet consumed is capped at ``MAX_PENDING`` bytes (beyond that, events are
dropped and ``dropped`` says so). Nothing a bridge sends can pin a host thread (the reader
is the only one that waits on it, and it ends with the exec) or grow the host unbounded.
"""

from __future__ import annotations

import json
import queue
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

from agent_sandbox.runtime.guest_client import GuestClient

MAX_EVENT = 8 << 20  # one line: a result bundle (a large PNG is a few MB of base64)
MAX_PENDING = 16 << 20  # events received but not yet consumed
_STDERR_TAIL = 16 * 1024  # kept for the error when a bridge dies at start
CLOSED: dict[str, Any] = {"t": "closed"}


class _Lines:
    """Bytes to complete lines; an over-long line is skipped to its end and counted."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._skipping = False
        self.overlong = 0

    def feed(self, data: bytes) -> Iterator[bytes]:
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if not self._skipping:
                self._buf += data[start:end]
                if len(self._buf) <= MAX_EVENT:
                    yield bytes(self._buf)
                else:
                    self.overlong += 1
            self._buf.clear()
            self._skipping = False
            start = end + 1
        if not self._skipping:
            self._buf += data[start:]
            if len(self._buf) > MAX_EVENT:
                self._buf.clear()
                self._skipping = True
                self.overlong += 1


def parse_event(line: bytes) -> dict[str, Any] | None:
    """A bridge line as an event (a dict with a string ``t``), or None if it is not one."""
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):  # bad UTF-8, bad JSON, 5000 digits, [[[[...
        return None
    if not isinstance(event, dict) or not isinstance(event.get("t"), str):
        return None
    return event


class KernelChannel:
    """One bridge process and the events it has sent."""

    def __init__(self, guest: GuestClient, argv: list[str], cwd: str) -> None:
        self._requests: queue.Queue[bytes | None] = queue.Queue()
        self._events: deque[tuple[dict[str, Any], int]] = deque()
        self._pending = 0
        self._cond = threading.Condition()
        self._lines = _Lines()
        self._closed = False
        self.dropped = False  # events lost to MAX_PENDING or MAX_EVENT since reset()
        self.stderr = ""
        self._thread = threading.Thread(target=self._run, args=(guest, argv, cwd),
                                        name="kernel-bridge", daemon=True)
        self._thread.start()

    # the reader thread -----------------------------------------------------------------
    def _stdin(self) -> Iterator[bytes]:
        while (item := self._requests.get()) is not None:
            yield item

    def _run(self, guest: GuestClient, argv: list[str], cwd: str) -> None:
        try:
            result = guest.exec(argv, cwd=cwd, timeout=None, max_output=_STDERR_TAIL,
                                stdin=self._stdin(), on_stdout=self._on_stdout)
            self.stderr = result.stderr.decode(errors="replace")
        except Exception as exc:  # noqa: BLE001 - any end of the exec is the bridge's end
            self.stderr = str(exc)
        finally:
            self._requests.put(None)  # the stdin feeder waits on this queue: let it end
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    def _on_stdout(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            event = parse_event(line)
            with self._cond:
                if event is None or self._pending + len(line) > MAX_PENDING:
                    self.dropped = True
                    continue
                event["_bytes"] = len(line)  # what it cost: the consumer's budget
                self._events.append((event, len(line)))
                self._pending += len(line)
                self._cond.notify_all()
        if self._lines.overlong:
            self.dropped = True

    # the consumer ----------------------------------------------------------------------
    def send(self, request: dict[str, Any]) -> None:
        self._requests.put(json.dumps(request).encode() + b"\n")

    def reset(self) -> None:
        """Forget what was not consumed (events of an earlier cell) and the dropped flag."""
        with self._cond:
            self._events.clear()
            self._pending = 0
            self.dropped = False
            self._lines.overlong = 0

    def next(self, timeout: float) -> dict[str, Any] | None:
        """The next event, ``CLOSED`` once the bridge has ended, or None after timeout."""
        with self._cond:
            if not self._events and not self._closed:
                self._cond.wait(timeout)
            if self._events:
                event, size = self._events.popleft()
                self._pending -= size
                return event
            return CLOSED if self._closed else None

    def close(self) -> None:
        """End the bridge: its stdin closes and it exits (the exec then ends)."""
        self._requests.put(None)
