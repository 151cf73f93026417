"""Idle timeouts: pause sandboxes nothing has used for their timeout, and stop the
containers of ones paused for long (memory released, disk kept)."""

from __future__ import annotations

import threading
import time

from agent_sandbox.runtime.config import EngineConfig
from agent_sandbox.runtime.sandboxes import Sandboxes
from agent_sandbox.runtime.store import SandboxState

_BASE_REFRESH_EVERY = 10.0


def reap_once(sandboxes: Sandboxes, config: EngineConfig, now: float | None = None) -> None:
    """Idle = no call in flight and none for the timeout; the next use of a stopped one
    boots it again, without the processes it had."""
    now = time.time() if now is None else now
    for row in sandboxes.store.list_sandboxes():
        idle_until = row.last_used + row.timeout
        try:
            if sandboxes.activity.active(row.id):
                continue  # a call is in flight: not idle, whatever last_used says
            if row.state == SandboxState.RUNNING and idle_until < now:
                sandboxes.pause(row.id)
            elif row.state == SandboxState.PAUSED and idle_until + config.paused_stop_after < now:
                with sandboxes.lock(row.id):
                    state = sandboxes.runc.state(row.id)
                    # Rootless containers stay "running" for runc (stopped processes).
                    if state and state["status"] in ("paused", "running"):
                        sandboxes.runc.delete(row.id)
                        sandboxes.booter.stop_network(row.id)
        except Exception:  # noqa: BLE001 - one bad sandbox must not stop the reaper
            continue


def reap_loop(sandboxes: Sandboxes, config: EngineConfig, stop: threading.Event) -> None:
    last_refresh = time.monotonic()
    while not stop.wait(config.reaper_interval):
        try:
            reap_once(sandboxes, config)
            if time.monotonic() - last_refresh > _BASE_REFRESH_EVERY:
                last_refresh = time.monotonic()
                sandboxes.templates.refresh_base()  # new sandboxes see the host's new /etc
        except Exception:  # noqa: BLE001 - keep reaping whatever happened
            continue
