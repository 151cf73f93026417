"""Warm pool: started, unclaimed sandboxes per pooled template, so a create that fits
(``service.lifecycle.poolable``) returns in milliseconds."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agent_sandbox.backends.runc.sandboxes import Sandboxes
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import SandboxState
from agent_sandbox.guestlink.client import GuestClient, GuestUnavailableError
from agent_sandbox.service.record import SandboxRecord, new_id

log = logging.getLogger(__name__)
FIRST_CREATE_GRACE = 10.0  # seconds the pool waits for the first create after opening


class WarmPool:
    def __init__(self, sandboxes: Sandboxes, config: EngineConfig,
                 stop: threading.Event) -> None:
        self.sandboxes = sandboxes
        self.config = config
        self._stop = stop
        self.wake = threading.Event()
        # Creates of this process under way: the pool waits for them (a new user's first
        # call must not share two cores with the pool's boots).
        self._creates = 0
        self._idle = threading.Condition()
        # The pool starts once the process's first create is done (or a while after
        # the engine opens): that create is usually what opened it.
        self._first_done = threading.Event()

    @contextmanager
    def first_served(self) -> Iterator[None]:
        """Around a create that does not come from the pool: the pool waits meanwhile."""
        with self._idle:
            self._creates += 1
        try:
            yield
        finally:
            with self._idle:
                self._creates -= 1
                self._idle.notify_all()
            self._first_done.set()

    def _after_creates(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._creates == 0 or self._stop.is_set(), timeout=60)

    def claim(self, template: str, **fields: Any) -> str | None:
        """A live pooled sandbox, now the caller's (fields set), or None."""
        store = self.sandboxes.store
        now = time.time()
        while True:
            sandbox_id = store.claim_pooled(template, self.config.limits.__dict__,
                                            created_at=now, last_used=now, **fields)
            self.wake.set()
            if sandbox_id is None:
                return None
            try:
                GuestClient(self.sandboxes.socket(sandbox_id), connect_timeout=1.0).ping()
                return sandbox_id
            except GuestUnavailableError:
                # A pooled sandbox that died meanwhile (host reboot): drop it, try another.
                row = store.get_sandbox(sandbox_id)
                if row is not None:
                    self.sandboxes.destroy(row, delete_volume=True)

    def run(self) -> None:
        self._first_done.wait(timeout=FIRST_CREATE_GRACE)
        while not self._stop.is_set():
            self.wake.wait(timeout=30)
            self.wake.clear()
            for template in self.config.pool_templates:
                try:
                    self._fill(template)
                except Exception:  # noqa: BLE001 - a failed refill must not end the loop
                    self._stop.wait(5)

    def _fill(self, template: str) -> None:
        self._after_creates()
        tmpl = self.sandboxes.templates.get(template)
        store = self.sandboxes.store
        while not self._stop.is_set() and store.count_pooled(template) < self.config.pool_size:
            self._after_creates()
            sandbox_id = new_id()
            now = time.time()
            row = SandboxRecord(
                id=sandbox_id, template=tmpl.name, state=SandboxState.CREATING, created_at=now,
                last_used=now, timeout=300.0, persistent=False, network=NetworkPolicy(),
                volume_id=f"vol-{sandbox_id[4:]}", limits=self.config.limits.__dict__,
                layers=[{"target": x.target, "lowers": x.lowers} for x in tmpl.layers],
            )
            self.sandboxes.make(row, new_volume=True, final_state=SandboxState.POOLED)
            try:
                self.sandboxes.hooks.pooled(row)  # a code template's kernel, started
            except Exception:  # noqa: BLE001 - it starts on the first cell instead
                if not self._stop.is_set():  # not the pool's own drain at close
                    log.warning("warm kernel of pooled sandbox %s did not start",
                                sandbox_id, exc_info=True)

    def drain(self) -> int:
        """Destroy every warm, unclaimed sandbox; returns how many."""
        drained = 0
        for row in self.sandboxes.store.list_sandboxes():
            if row.state == SandboxState.POOLED:
                self.sandboxes.hooks.guest_gone(row.id, keep_contexts=False)
                self.sandboxes.destroy(row, delete_volume=True)
                drained += 1
        return drained
