"""What the host keeps about a sandbox's kernels, and the files it makes for them.

Per context, ``<sandbox dir>/kernels/<context>.json`` (host-only) holds the kernel's pid,
socket names, HMAC key and cwd, so a new engine process reconnects to a live kernel. The
connection file the kernel reads is written into the sandbox's run dir by a confined
descriptor, never by path: the sandbox controls that directory and could swap in a link.
A context of an account (``user``) has a directory of its own there (``kernel_user``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent_sandbox.core.errors import NotFoundError
from agent_sandbox.service.code.users import connection_inside

if TYPE_CHECKING:
    from agent_sandbox.core.templates import Template
    from agent_sandbox.guestlink.client import GuestClient
    from agent_sandbox.service.record import SandboxRecord

PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}


class KernelHost(Protocol):
    """What kernels need of the engine: where a sandbox's host-only files are, its row
    and template, a client for its guest (resuming it), its environment, and who owns
    the files the host makes for the sandbox's root (None: the engine's own user)."""

    sandbox_owner: int | None

    def sandbox_dir(self, sandbox_id: str) -> Path: ...

    def client(self, sandbox_id: str) -> GuestClient:
        """A client of the sandbox's guest as it is (no resume)."""
        ...

    def row(self, sandbox_id: str) -> SandboxRecord: ...

    def template_for(self, row: SandboxRecord) -> Template: ...

    def guest(self, sandbox_id: str, row: SandboxRecord | None = None) -> GuestClient: ...

    def env(self, row: SandboxRecord, extra: dict[str, str] | None) -> dict[str, str]: ...

    def touch(self, sandbox_id: str) -> None: ...

@dataclass
class KernelState:
    """What the host keeps about one context (``<sandbox dir>/kernels/<ctx>.json``)."""

    context: str
    cwd: str
    key: str
    pid: int | None = None
    prefix: str | None = None  # the kernel's socket files are run/<prefix>-<port>
    started_at: float = 0.0
    user: str | None = None  # the account kernel and bridge run as (None: root)
    language: str = "python"  # core/code_languages.py
    port: int = 0  # a TCP kernel's first port on the sandbox's loopback (0: ipc sockets)

    @property
    def inside(self) -> str:
        """The connection file's path inside the sandbox."""
        assert self.prefix is not None
        return connection_inside(self.prefix, self.user)


class KernelFiles:
    """What the host keeps about a sandbox's kernels (here), and the files it makes for
    them inside the sandbox (the backend's: how it reaches the sandbox's run dir)."""

    def __init__(self, host: KernelHost) -> None:
        self.host = host

    def state_dir(self, sandbox_id: str) -> Path:
        return self.host.sandbox_dir(sandbox_id) / "kernels"

    def load(self, sandbox_id: str, context: str) -> KernelState | None:
        path = self.state_dir(sandbox_id) / f"{context}.json"
        try:
            return KernelState(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def save(self, sandbox_id: str, state: KernelState) -> None:
        folder = self.state_dir(sandbox_id)
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
        except FileNotFoundError:  # its directory went with it: killed meanwhile
            raise NotFoundError(f"sandbox {sandbox_id} not found (it was killed)") from None
        tmp = folder / f".{state.context}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(state), fh)
        os.replace(tmp, folder / f"{state.context}.json")

    def write_connection(self, sandbox_id: str, state: KernelState) -> None:
        """The connection file the kernel reads, made new inside the sandbox (an
        account's context: in a directory of its own)."""
        raise NotImplementedError

    def remove(self, sandbox_id: str, state: KernelState) -> None:
        """The context's files inside the sandbox, gone (what the sandbox left in an
        account's directory too)."""
        raise NotImplementedError


def connection(state: KernelState, ip: str) -> dict[str, Any]:
    """The kernel's connection file: ``ipc`` sockets at ``ip``-N, or (a kernel that binds
    only TCP, such as Deno's) five ports on the sandbox's own loopback from ``port``."""
    common = {"key": state.key, "signature_scheme": "hmac-sha256",
              "kernel_name": state.language}
    if state.port:
        return {"transport": "tcp", "ip": "127.0.0.1", **common,
                **{name: state.port + n - 1 for name, n in PORTS.items()}}
    return {"transport": "ipc", "ip": ip, **common, **PORTS}
