"""What the host keeps about a sandbox's kernels, and the files it makes for them.

Per context, ``<sandbox dir>/kernels/<context>.json`` (host-only) holds the kernel's pid,
socket names, HMAC key and cwd, so a new engine process reconnects to a live kernel. The
connection file the kernel reads is written into the sandbox's run dir by a confined
descriptor, never by path: the sandbox controls that directory and could swap in a link.
A context of an account (``user``) has a directory of its own there (``kernel_user``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent_sandbox.runtime import confined
from agent_sandbox.runtime.kernel_user import (
    CONNECTION,
    connection_inside,
    dir_name,
    open_run_to_accounts,
    sockets_inside,
)

if TYPE_CHECKING:
    from agent_sandbox.runtime.guest_client import GuestClient
    from agent_sandbox.runtime.store import SandboxRow
    from agent_sandbox.runtime.templates import Template

_MAX_ENTRIES = 4096  # a context's own directory: what is unlinked in it, at most
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

    def row(self, sandbox_id: str) -> SandboxRow: ...

    def template_for(self, row: SandboxRow) -> Template: ...

    def guest(self, sandbox_id: str, row: SandboxRow | None = None) -> GuestClient: ...

    def env(self, row: SandboxRow, extra: dict[str, str] | None) -> dict[str, str]: ...

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

    @property
    def inside(self) -> str:
        """The connection file's path inside the sandbox."""
        assert self.prefix is not None
        return connection_inside(self.prefix, self.user)


class KernelFiles:
    def __init__(self, host: KernelHost) -> None:
        self.host = host

    def state_dir(self, sandbox_id: str) -> Path:
        return self.host.sandbox_dir(sandbox_id) / "kernels"

    def run_dir(self, sandbox_id: str) -> Path:
        return self.host.sandbox_dir(sandbox_id) / "run"

    def load(self, sandbox_id: str, context: str) -> KernelState | None:
        path = self.state_dir(sandbox_id) / f"{context}.json"
        try:
            return KernelState(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def save(self, sandbox_id: str, state: KernelState) -> None:
        folder = self.state_dir(sandbox_id)
        folder.mkdir(mode=0o700, exist_ok=True)
        tmp = folder / f".{state.context}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(state), fh)
        os.replace(tmp, folder / f"{state.context}.json")

    def write_connection(self, sandbox_id: str, state: KernelState) -> None:
        """``run/<prefix>.json`` (an account's context: ``run/<prefix>.d/kernel.json``),
        made new (never an existing file or link)."""
        assert state.prefix is not None
        run = confined.open_dir(self.run_dir(sandbox_id))
        try:
            if state.user is None:
                fd = confined.open_beneath(run, f"{state.prefix}.json",
                                           os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            else:
                fd = self._own_dir_file(sandbox_id, run, state.prefix)
        finally:
            os.close(run)
        # The kernel (the sandbox's root) may rewrite it: owned by that user, by fchown.
        if self.host.sandbox_owner is not None:
            os.fchown(fd, self.host.sandbox_owner, self.host.sandbox_owner)
        with os.fdopen(fd, "w") as fh:
            json.dump(connection(state, sockets_inside(state.prefix, state.user)), fh)

    def _own_dir_file(self, sandbox_id: str, run: int, prefix: str) -> int:
        """A new ``<prefix>.d`` (the sandbox root's until ``kernel_user.hand_over``) and a
        new connection file in it; the run dir made traversable."""
        open_run_to_accounts(self.run_dir(sandbox_id))
        os.mkdir(dir_name(prefix), 0o700, dir_fd=run)  # EEXIST if anything is there
        try:
            sub = confined.open_beneath(run, dir_name(prefix), os.O_RDONLY | os.O_DIRECTORY)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rmdir(dir_name(prefix), dir_fd=run)
            raise
        try:
            if self.host.sandbox_owner is not None:
                os.fchown(sub, self.host.sandbox_owner, self.host.sandbox_owner)
            return confined.open_beneath(sub, CONNECTION, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        finally:
            os.close(sub)

    def remove(self, sandbox_id: str, state: KernelState) -> None:
        if not state.prefix:
            return
        names = [f"{state.prefix}.json", *(f"{state.prefix}-{p}" for p in PORTS.values())]
        with contextlib.suppress(OSError):
            run = confined.open_dir(self.run_dir(sandbox_id))
            try:
                if state.user is not None:
                    self._empty_own_dir(run, dir_name(state.prefix))
                    with contextlib.suppress(OSError):
                        os.rmdir(dir_name(state.prefix), dir_fd=run)  # never follows
                    names = []
                for name in names:
                    with contextlib.suppress(OSError):
                        confined.unlink_beneath(run, name)
            finally:
                os.close(run)

    @staticmethod
    def _empty_own_dir(run: int, name: str) -> None:
        """Unlink what an account's context directory holds (the account's: anything it
        made there, a bounded number of entries, nothing followed, subdirectories left)."""
        with contextlib.suppress(OSError):
            sub = confined.open_beneath(run, name, os.O_RDONLY | os.O_DIRECTORY)
            try:
                with os.scandir(sub) as entries:
                    found = [e.name for e in itertools.islice(entries, _MAX_ENTRIES)]
                for entry in found:
                    with contextlib.suppress(OSError):
                        confined.unlink_beneath(sub, entry)
            finally:
                os.close(sub)


def connection(state: KernelState, ip: str) -> dict[str, Any]:
    return {"transport": "ipc", "ip": ip, "key": state.key,
            "signature_scheme": "hmac-sha256", "kernel_name": "python3", **PORTS}
