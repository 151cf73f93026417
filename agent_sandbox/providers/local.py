"""The embedded engine as a provider: the service over runc containers on this host, no
server in between."""

from __future__ import annotations

import atexit
import logging
import threading

from agent_sandbox.backends.runc.backend import RuncBackend
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.config.settings import Settings
from agent_sandbox.service.service import SandboxService

_engine: SandboxService | None = None
_guard = threading.Lock()
log = logging.getLogger(__name__)


def embedded_service(config: EngineConfig | None = None, *,
                     reaper: bool = True) -> SandboxService:
    """A service over this host's runc backend (``config``: None reads the environment).
    ``reaper``: this process keeps the idle timeouts (another process may share the data
    dir and do it instead: a second one in a process is for tests and tools)."""
    config = config or EngineConfig()
    return SandboxService(RuncBackend(config), config, reaper=reaper)


def local_provider(settings: Settings | None = None) -> SandboxService:
    """The process-wide engine (one per process; many processes may share a data dir),
    configured by the ``settings`` of the first call (None: the environment)."""
    global _engine
    with _guard:
        if _engine is None:
            _engine = embedded_service(EngineConfig.from_settings(settings or Settings()))
            atexit.register(_engine.close)  # releases host mounts nothing needs any more
        return _engine


def running_engine() -> SandboxService | None:
    """The engine if this process has started one (without starting it)."""
    return _engine


def drain_running_pool() -> None:
    """Destroy this process's warm sandboxes at exit (they would outlive it); no engine
    in this process (a remote provider) means no pool."""
    try:
        if _engine is not None:
            _engine.drain_pool()
    except Exception:  # noqa: BLE001 - best effort at exit
        log.exception("could not drain the warm pool")


def engine_status(provider: object) -> dict[str, object] | None:
    """This host's engine as its operator sees it: the warm pool (size, templates, warm
    ones now) and the runc lifecycle supervisor; None for a provider that is not an
    engine here (a remote gateway)."""
    if not isinstance(provider, SandboxService):
        return None
    from agent_sandbox.core.states import SandboxState

    config = provider.config
    warm = sum(1 for r in provider.backend.records() if r.state == SandboxState.POOLED)
    status: dict[str, object] = {"pool": {"size": config.pool_size, "warm": warm,
                                          "templates": list(config.pool_templates)},
                                 "supervisor": None}
    if isinstance(provider.backend, RuncBackend):
        from agent_sandbox.backends.runc import supervisor

        found = supervisor.status(config.data_dir)
        status["supervisor"] = {"running": found.running, "pid": found.pid,
                                "since": found.since}
    return status


__all__ = ["local_provider", "running_engine", "drain_running_pool", "embedded_service",
           "engine_status"]
