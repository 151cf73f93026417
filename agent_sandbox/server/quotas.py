"""Per-key quotas: live sandboxes and concurrent foreground commands.

Hitting one raises ResourceExhaustedError (429) with ``retry_after`` seconds, which the
error handler turns into a ``Retry-After`` header. Counters live in this process: one
gateway per host is the deployment this is meant for.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from agent_sandbox.errors import ResourceExhaustedError
from agent_sandbox.server.keys import ApiKey

SANDBOX_RETRY_AFTER = 30
COMMAND_RETRY_AFTER = 1
TERMINALS_PER_KEY = 64  # terminal attachments (WebSockets) one key holds open at once


class Quotas:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._creating: Counter[str] = Counter()
        self._running: Counter[str] = Counter()
        self._terminals: Counter[str] = Counter()

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

    @contextmanager
    def command_slot(self, key: ApiKey | None) -> Iterator[None]:
        if key is None:
            yield
            return
        with self._lock:
            if self._running[key.id] >= key.max_commands:
                raise ResourceExhaustedError(
                    f"API key {key.name!r} already runs {key.max_commands} commands at once "
                    "(its quota); retry when one ends",
                    details={"quota": "max_commands", "limit": key.max_commands,
                             "retry_after": COMMAND_RETRY_AFTER})
            self._running[key.id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._running[key.id] -= 1

    @contextmanager
    def terminal_slot(self, key: ApiKey | None) -> Iterator[None]:
        """Held while a terminal attachment is open (each holds a gateway thread)."""
        if key is None:
            yield
            return
        with self._lock:
            if self._terminals[key.id] >= TERMINALS_PER_KEY:
                raise ResourceExhaustedError(
                    f"API key {key.name!r} already has {TERMINALS_PER_KEY} terminals attached; "
                    "disconnect one first",
                    details={"quota": "terminals", "limit": TERMINALS_PER_KEY,
                             "retry_after": COMMAND_RETRY_AFTER})
            self._terminals[key.id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._terminals[key.id] -= 1
