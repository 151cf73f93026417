"""Idle means no activity: calls in flight keep their sandbox awake.

A command that runs for minutes, a file streamed slowly, a long ``run_code`` cell: while
any call on a sandbox is in flight, its ``last_used`` is refreshed in the store every
``HEARTBEAT`` seconds, so no reaper (of this process or another sharing the store) takes
it for idle, and the idle timeout starts when the last call ends. A background process
nobody is waiting on is not activity: a forgotten server does not keep a sandbox awake.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

HEARTBEAT = 0.5
_TOUCH_AFTER = 1.0  # a call shorter than this was touched when it began; no write at its end


class Activity:
    def __init__(self, touch: Callable[[str], None], stop: threading.Event,
                 on_idle: Callable[[], None] = lambda: None) -> None:
        self._touch = touch
        self._stop = stop
        self._on_idle = on_idle  # a sandbox's last call ended: its idle timeout starts
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._beating = False

    def active(self, sandbox_id: str) -> bool:
        with self._lock:
            return self._calls[sandbox_id] > 0

    @contextmanager
    def busy(self, sandbox_id: str) -> Iterator[None]:
        started = time.monotonic()
        with self._lock:
            self._calls[sandbox_id] += 1
            start_beat = not self._beating
            self._beating = True
        if start_beat:
            threading.Thread(target=self._beat, name="abx-activity", daemon=True).start()
        try:
            yield
        finally:
            with self._lock:
                self._calls[sandbox_id] -= 1
                idle = self._calls[sandbox_id] <= 0
                if idle:
                    del self._calls[sandbox_id]
            if time.monotonic() - started > _TOUCH_AFTER:
                self._quiet_touch(sandbox_id)  # the idle timeout starts now
            if idle:
                self._on_idle()

    def _quiet_touch(self, sandbox_id: str) -> None:
        try:
            self._touch(sandbox_id)
        except Exception:  # noqa: BLE001 - a busy store must not fail the call it records
            pass

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            with self._lock:
                busy = list(self._calls)
            for sandbox_id in busy:
                self._quiet_touch(sandbox_id)


def streamed(activity: Activity, sandbox_id: str, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """A guest operation's chunks (a file, a directory's tar stream): the first pulled now,
    so errors (a missing path) surface at the call site; the rest read later, that slow
    read counting as the sandbox's activity."""
    first = next(chunks, None)

    def rest() -> Iterator[bytes]:
        with activity.busy(sandbox_id):
            if first is not None:
                yield first
            yield from chunks

    return rest()
