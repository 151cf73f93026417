"""Kernel connection files made through the guest: a Pod's file system is not this
host's. What the provider keeps about each context (pid, key) stays host-side, in its
data dir; a provider that lost it restarts the context's kernel on next use."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.inside import GUEST_RUN_DIR
from agent_sandbox.service.code.files import PORTS, KernelFiles, KernelState, connection
from agent_sandbox.service.code.users import connection_inside, dir_name, sockets_inside


class GuestKernelFiles(KernelFiles):
    def state_dir(self, sandbox_id: str) -> Path:
        folder = self.host.sandbox_dir(sandbox_id) / "kernels"
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        return folder

    def write_connection(self, sandbox_id: str, state: KernelState) -> None:
        assert state.prefix is not None
        guest = self.host.client(sandbox_id)
        if state.user is not None:
            guest.mkdir(f"{GUEST_RUN_DIR}/{dir_name(state.prefix)}")
        data = json.dumps(connection(state, sockets_inside(state.prefix, state.user)))
        guest.write(connection_inside(state.prefix, state.user), data.encode(), mode=0o600)

    def remove(self, sandbox_id: str, state: KernelState) -> None:
        if not state.prefix:
            return
        if state.user is not None:
            names = [dir_name(state.prefix)]
        else:
            names = [f"{state.prefix}.json", *(f"{state.prefix}-{p}" for p in PORTS.values())]
        with contextlib.suppress(SandboxError):
            guest = self.host.client(sandbox_id)
            for name in names:
                with contextlib.suppress(SandboxError):
                    guest.remove(f"{GUEST_RUN_DIR}/{name}", recursive=True)
