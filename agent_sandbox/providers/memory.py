"""The service over the memory backend (``ABX_ENGINE=memory``): one per process."""

from __future__ import annotations

import atexit
import threading

from agent_sandbox.backends.memory.backend import MemoryBackend
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.config.settings import Settings
from agent_sandbox.service.service import SandboxService

_service: SandboxService | None = None
_guard = threading.Lock()


def memory_service(config: EngineConfig | None = None) -> SandboxService:
    """A new service over a memory backend of its own."""
    config = config or EngineConfig()
    return SandboxService(MemoryBackend(config), config)


def memory_provider(settings: Settings | None = None) -> SandboxService:
    global _service
    with _guard:
        if _service is None:
            _service = memory_service(EngineConfig.from_settings(settings or Settings()))
            atexit.register(_service.close)
        return _service
