"""Per-key quotas: live sandboxes, and concurrent commands, uploads, terminals and lock
calls.

Hitting one raises ResourceExhaustedError (429) with ``retry_after`` seconds, which the
error handler turns into a ``Retry-After`` header. Counters live in this process: one
gateway per host is the deployment this is meant for.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from agent_sandbox.core.errors import ResourceExhaustedError
from agent_sandbox.surfaces.http.keys import ApiKey

SANDBOX_RETRY_AFTER = 30
COMMAND_RETRY_AFTER = 1
TERMINALS_PER_KEY = 64  # terminal attachments (WebSockets) one key holds open at once
LOCK_CALLS_PER_KEY = 16  # lock calls one key has under way (each may wait up to 30 s)


class Quotas:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._creating: Counter[str] = Counter()
        self._running: Counter[str] = Counter()
        self._terminals: Counter[str] = Counter()
        self._uploads: Counter[str] = Counter()
        self._locking: Counter[str] = Counter()

    @contextmanager
    def sandbox_slot(self, key: ApiKey | None, live: Callable[[], int]) -> Iterator[None]:
        """Hold a slot while creating; ``live`` counts the key's sandboxes now."""
        if key is None:
            yield
            return
        with self._lock:
            used = live() + self._creating[key.id]
            if used >= key.max_sandboxes:
                raise ResourceExhaustedError(
                    f"API key {key.name!r} has {used} live sandboxes, its quota is "
                    f"{key.max_sandboxes}; kill one first",
                    details={"quota": "max_sandboxes", "limit": key.max_sandboxes,
                             "retry_after": SANDBOX_RETRY_AFTER})
            self._creating[key.id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._creating[key.id] -= 1

    def command_slot(self, key: ApiKey | None) -> AbstractContextManager[None]:
        """Held while a command (or code cell) runs and its output streams."""
        return self._slot(self._running, key, key.max_commands if key else 0,
                          "commands at once", "max_commands")

    def upload_slot(self, key: ApiKey | None) -> AbstractContextManager[None]:
        """Held while an upload streams in (each holds a gateway thread as long as its
        client sends): as many as the key's commands, counted apart from them."""
        return self._slot(self._uploads, key, key.max_commands if key else 0,
                          "uploads at once", "max_commands")

    def terminal_slot(self, key: ApiKey | None) -> AbstractContextManager[None]:
        """Held while a terminal attachment is open (each holds a gateway thread)."""
        return self._slot(self._terminals, key, TERMINALS_PER_KEY, "terminals attached",
                          "terminals")

    def lock_slot(self, key: ApiKey | None) -> AbstractContextManager[None]:
        """Held while a lock call waits for its turn (each holds a gateway thread up to
        its wait): one key's waits cannot take every thread of the gateway."""
        return self._slot(self._locking, key, LOCK_CALLS_PER_KEY, "lock calls under way",
                          "lock_calls")

    @contextmanager
    def _slot(self, counter: Counter[str], key: ApiKey | None, limit: int, what: str,
              quota: str) -> Iterator[None]:
        if key is None:
            yield
            return
        with self._lock:
            if counter[key.id] >= limit:
                raise ResourceExhaustedError(
                    f"API key {key.name!r} already has {limit} {what} (its quota); retry "
                    "when one ends",
                    details={"quota": quota, "limit": limit,
                             "retry_after": COMMAND_RETRY_AFTER})
            counter[key.id] += 1
        try:
            yield
        finally:
            with self._lock:
                counter[key.id] -= 1
