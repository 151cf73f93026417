"""Cancelling a blocking SDK call that runs in a worker thread.

``AsyncSandbox`` runs each sync call in a thread; cancelling the awaiting task (an MCP
client's ``notifications/cancelled``, a client going away) cannot stop that thread, but it
can stop what the call started. The thread runs under a ``CallCancel``; whatever the call
opens registers how to end it (a guest connection is shut down: the guest then kills its
foreground command, a transfer stops) and loops that poll (a code cell) ask
``cancelled()`` and interrupt what they run.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from agent_sandbox.core.errors import CancelledCallError

T = TypeVar("T")
_local = threading.local()


class CallCancel:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closers: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()
        self.cancelled = False

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` with this as the thread's current call."""
        outer = getattr(_local, "call", None)
        _local.call = self
        try:
            return fn(*args, **kwargs)
        finally:
            _local.call = outer

    def register(self, closer: Callable[[], None]) -> int:
        """``closer`` ends something the call opened; it runs at once if already cancelled."""
        with self._lock:
            key = next(self._ids)
            self._closers[key] = closer
            late = self.cancelled
        if late:
            closer()
        return key

    def unregister(self, key: int) -> None:
        with self._lock:
            self._closers.pop(key, None)

    @contextlib.contextmanager
    def registered(self, closer: Callable[[], None]) -> Iterator[None]:
        """``closer`` runs on a cancel while the block runs (at once if already)."""
        key = self.register(closer)
        try:
            yield
        finally:
            self.unregister(key)

    def cancel(self) -> None:
        """Stop what the call started; non-blocking (safe on an event loop)."""
        with self._lock:
            self.cancelled = True
            closers = list(self._closers.values())
        for closer in closers:
            try:
                closer()
            except Exception:  # noqa: BLE001, S110 - best effort: the others still run
                pass


@contextlib.contextmanager
def detached() -> Iterator[None]:
    """Run cleanup that must not be cancelled (interrupting a cell) inside a cancelled call."""
    outer = getattr(_local, "call", None)
    _local.call = None
    try:
        yield
    finally:
        _local.call = outer


@contextlib.contextmanager
def held(lock: threading.Lock, what: str, poll: float = 0.2) -> Iterator[None]:
    """``lock`` for the block; a call cancelled while it waits gives up (``CancelledCallError``)
    instead of doing what it waited for after its caller is gone."""
    call = current()
    while not lock.acquire(timeout=poll):
        if call is not None and call.cancelled:
            raise CancelledCallError(f"{what} was cancelled before it started")
    try:
        yield
    finally:
        lock.release()


def current() -> CallCancel | None:
    """The cancellable call this thread is running, if any."""
    return getattr(_local, "call", None)


def cancelled() -> bool:
    call = current()
    return call is not None and call.cancelled
