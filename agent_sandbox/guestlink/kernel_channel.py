"""The host end of a kernel bridge (``guest/kernel_bridge.py``): hostile lines in, bounded.

The bridge runs inside the sandbox as a foreground exec with stdin open, on a thread of
ours; its stdout arrives through the guest's bounded frames and is split here into lines
of at most ``MAX_EVENT`` bytes. The reader thread only splits and queues raw lines (no
parsing: a line built to be slow to parse must not hold the GIL for every tenant), at
most ``MAX_PENDING`` bytes of them, each charged for what parsing it can cost; beyond
that lines are dropped and ``dropped`` says so. The consumer parses and checks each line
as it takes it. ``close`` ends the exec from the host side (the guest then kills the
bridge), so no bridge can keep a host thread or socket.
"""

from __future__ import annotations

import json
import queue
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

from agent_sandbox.guestlink.client import Cancel, GuestClient

MAX_EVENT = 8 << 20  # one line: a result bundle (a large PNG is a few MB of base64)
MAX_PENDING = 16 << 20  # received but not yet consumed, charged as ``cost``
MAX_CONTAINERS = 100_000  # JSON arrays/objects in one line: more is refused unparsed
CONTAINER_COST = 64  # host bytes a parsed empty list or dict costs, about
_STDERR_TAIL = 16 * 1024  # kept for the error when a bridge dies at start
CLOSED: dict[str, Any] = {"t": "closed"}


def cost(line: bytes) -> int:
    """What holding ``line`` parsed may cost the host, in bytes (containers dominate)."""
    return len(line) + CONTAINER_COST * (line.count(b"[") + line.count(b"{"))


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


def _no_constant(_name: str) -> None:
    return None


def parse_event(line: bytes) -> dict[str, Any] | None:
    """A bridge line as an event (a dict with a string ``t``), or None if it is not one."""
    if line.count(b"[") + line.count(b"{") > MAX_CONTAINERS:
        return None  # refused before json.loads could spend seconds building it
    try:
        # NaN and Infinity are no JSON: null, so that every surface passes on valid JSON.
        event = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # bad UTF-8, bad JSON, 5000 digits, [[[[...
        return None
    if not isinstance(event, dict) or not isinstance(event.get("t"), str):
        return None
    event["_bytes"] = cost(line)  # the cell's budget charges the same
    return event


class KernelChannel:
    """One bridge process and the lines it has sent."""

    def __init__(self, guest: GuestClient, argv: list[str], cwd: str,
                 user: str | None = None) -> None:
        self._requests: queue.Queue[bytes | None] = queue.Queue()
        self._pending: deque[tuple[bytes, int]] = deque()
        self._pending_cost = 0
        self._cond = threading.Condition()
        self._lines = _Lines()
        self._cancel = Cancel()
        self._closed = False
        self._woken = False
        self.dropped = False  # lines lost (budget, length, not an event) since reset()
        self.stderr = ""
        self._thread = threading.Thread(target=self._run, args=(guest, argv, cwd, user),
                                        name="kernel-bridge", daemon=True)
        self._thread.start()

    # the reader thread -----------------------------------------------------------------
    def _stdin(self) -> Iterator[bytes]:
        while (item := self._requests.get()) is not None:
            yield item

    def _run(self, guest: GuestClient, argv: list[str], cwd: str, user: str | None) -> None:
        try:
            result = guest.exec(argv, cwd=cwd, timeout=None, max_output=_STDERR_TAIL,
                                stdin=self._stdin(), on_stdout=self._on_stdout,
                                cancel=self._cancel, user=user)
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
            charge = cost(line)
            with self._cond:
                if self._pending_cost + charge > MAX_PENDING:
                    self.dropped = True
                    continue
                self._pending.append((line, charge))
                self._pending_cost += charge
                self._cond.notify_all()
        if self._lines.overlong:
            with self._cond:
                self._lines.overlong = 0
                self.dropped = True

    # the consumer ----------------------------------------------------------------------
    def send(self, request: dict[str, Any]) -> None:
        self._requests.put(json.dumps(request).encode() + b"\n")

    def reset(self) -> None:
        """Forget what was not consumed (lines of an earlier cell) and the dropped flag."""
        with self._cond:
            self._pending.clear()
            self._pending_cost = 0
            self.dropped = False

    def next(self, timeout: float) -> dict[str, Any] | None:
        """The next event, ``CLOSED`` once the bridge has ended, or None after timeout."""
        with self._cond:
            if not self._pending and not self._closed and not self._woken:
                self._cond.wait(timeout)
            self._woken = False
            if not self._pending:
                return CLOSED if self._closed else None
            line, charge = self._pending.popleft()
            self._pending_cost -= charge
        event = parse_event(line)  # the caller's thread pays for parsing, budgeted
        if event is None:
            self.dropped = True
        return event

    def wake(self) -> None:
        """Make ``next`` return now (None if nothing came), from any thread: a cancelled
        call is noticed at once. Never blocks for long (safe on an event loop)."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def close(self) -> None:
        """End the bridge now: its connection is shut down and the guest kills it."""
        self._requests.put(None)
        self._cancel.cancel()
