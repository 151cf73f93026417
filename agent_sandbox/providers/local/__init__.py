"""The embedded engine as a provider: sandboxes on this host, no server in between."""

from __future__ import annotations

import atexit
import threading

from agent_sandbox.runtime.config import EngineConfig
from agent_sandbox.runtime.engine import Engine
from agent_sandbox.settings import Settings

_engine: Engine | None = None
_guard = threading.Lock()


def local_provider(settings: Settings | None = None) -> Engine:
    """The process-wide engine (one per process; many processes may share a data dir),
    configured by the ``settings`` of the first call (None: the environment)."""
    global _engine
    with _guard:
        if _engine is None:
            _engine = Engine(EngineConfig.from_settings(settings or Settings())).open()
            atexit.register(_engine.close)  # releases host mounts nothing needs any more
        return _engine


def running_engine() -> Engine | None:
    """The engine if this process has started one (without starting it)."""
    return _engine


__all__ = ["local_provider", "running_engine", "Engine"]
