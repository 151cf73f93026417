"""Which host mode this process runs sandboxes in: root's, or an ordinary user's."""

from __future__ import annotations

import os

from agent_sandbox.backends.runc.host.mode import HostMode
from agent_sandbox.backends.runc.host.root import RootHost
from agent_sandbox.backends.runc.host.rootless import RootlessHost
from agent_sandbox.config.engine import EngineConfig


def select_host_mode(config: EngineConfig) -> HostMode:
    """Root runs sandboxes with mounts and loop disks; anyone else, rootless."""
    if os.geteuid() == 0:
        return RootHost(config)
    return RootlessHost(config)
