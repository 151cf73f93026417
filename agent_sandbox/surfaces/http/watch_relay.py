"""The gateway's side of a directory watch: the engine's events to a client as
Server-Sent Events.

A thread reads the engine's watch into a bounded queue (``MAX_EVENTS`` / ``MAX_BYTES``);
the response drains it on the event loop, holding no worker thread while it waits. A
client that reads slower than the sandbox changes files gets one ``overflow`` event per
gap, not a grown gateway. A key holds at most ``MAX_WATCHES_PER_KEY`` watches at once.

The stream: ``event: ready`` (``{"backend": ...}``) once the sandbox watches, then one
unnamed event per change (a ``FilesystemEvent`` as JSON), ``: keepalive`` comments while
quiet, and at the end ``event: end`` (``{"reason": ...}``) or ``event: error`` (``{code,
message, details}``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from agent_sandbox.core.errors import ResourceExhaustedError, SandboxError
from agent_sandbox.core.models import FilesystemEvent
from agent_sandbox.core.watch import EventQueue, WatchStream
from agent_sandbox.surfaces.http.errors import log

KEEPALIVE = 15.0
MAX_EVENTS = 1024
MAX_BYTES = 4 << 20
MAX_WATCHES_PER_KEY = 32
_BATCH = 256  # events written to the client at once


class WatchSlots:
    """Watches running per owner (each holds a thread and a guest connection)."""

    def __init__(self, limit: int = MAX_WATCHES_PER_KEY) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()

    def take(self, owner: str) -> Callable[[], None]:
        """A slot for ``owner``; call what is returned (once) to give it back."""
        with self._lock:
            if self._held[owner] >= self.limit:
                raise ResourceExhaustedError(
                    f"{self.limit} directories are watched with this key already; stop "
                    "one first", details={"quota": "watches", "limit": self.limit,
                                          "retry_after": 5})
            self._held[owner] += 1
        given = threading.Event()

        def give_back() -> None:
            with self._lock:
                if not given.is_set():
                    given.set()
                    self._held[owner] -= 1

        return give_back


def _message(data: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


class Relay:
    def __init__(self, stream: WatchStream, loop: asyncio.AbstractEventLoop,
                 release: Callable[[], None]) -> None:
        self.stream = stream
        self.queue = EventQueue(MAX_EVENTS, MAX_BYTES)
        self.error: SandboxError | None = None
        self._loop = loop
        self._wake = asyncio.Event()
        self._waiting = False
        self._release = release
        threading.Thread(target=self._pump, name="abx-gw-watch", daemon=True).start()

    def _pump(self) -> None:
        try:
            for event in self.stream:
                self.queue.put(event)
                self._notify()
        except SandboxError as exc:
            self.error = exc
        except Exception as exc:  # noqa: BLE001 - becomes an error event, not a hang
            log.exception("watch relay failed")
            self.error = SandboxError(f"internal error: {type(exc).__name__}")
        finally:
            self.queue.finish()
            self._release()
            self._notify()

    def _notify(self) -> None:
        if self._waiting:
            self._waiting = False
            try:
                self._loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # the loop is closed: nobody reads any more
                pass

    async def batches(self) -> AsyncIterator[list[FilesystemEvent]]:
        """The events as they come, in batches; an empty batch after each ``KEEPALIVE``
        seconds of quiet. Ends once the watch ended and its events were taken (``error``
        then says whether it failed). Holds no thread while it waits."""
        while True:
            events = self.queue.drain(_BATCH)
            if events:
                yield events
                continue
            if self.queue.finished:
                return
            self._wake.clear()
            self._waiting = True
            if len(self.queue) or self.queue.finished:  # came meanwhile
                self._waiting = False
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), KEEPALIVE)
            except TimeoutError:
                self._waiting = False
                yield []

    async def sse(self) -> AsyncIterator[bytes]:
        try:
            yield _message({"backend": self.stream.backend}, "ready")
            async for events in self.batches():
                yield b"".join(_message(e.model_dump(exclude_none=True)) for e in events) \
                    if events else b": keepalive\n\n"
            if self.error is not None:
                yield _message(self.error.to_dict(), "error")
            else:
                yield _message({"reason": self.stream.ended or "ended"}, "end")
        finally:
            self.stream.close()  # the client is gone or the end was sent: stop the watch
