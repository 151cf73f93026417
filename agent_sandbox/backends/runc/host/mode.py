"""How this host runs sandboxes: as root, or as an ordinary user (rootless).

Everything that differs between the two lives behind ``HostMode``: where a sandbox's
disk is and how it is made, attached and torn down, how its root filesystem is mounted,
what the OCI bundle gets on top of the shared policy, how it is frozen, which limits
really hold. The lifecycle code above it has no branch on the mode. A third backend (a
microVM, a pod) implements the same surface.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent_sandbox.backends.runc.netproxy.config import GATEWAY
from agent_sandbox.config.engine import EngineConfig

if TYPE_CHECKING:
    from agent_sandbox.backends.runc.runc import Runc
    from agent_sandbox.core.templates import Template
    from agent_sandbox.guestlink.client import GuestClient
    from agent_sandbox.service.record import SandboxRecord


RESOLV_CONF = f"nameserver {GATEWAY}\noptions timeout:1 attempts:2\n"


@dataclass(frozen=True)
class SharedFiles:
    """What every sandbox binds read-only from the host: the guest agent's code, an
    empty file (over /etc/ld.so.preload) and the policy resolver's resolv.conf."""

    guest_dir: str
    empty_file: str
    resolv_file: str


@dataclass(frozen=True)
class Layout:
    """Where a sandbox's files live on the host (nothing here is visible inside)."""

    config: EngineConfig
    volume_suffix: str  # ".img" for an image file, "" for a directory
    # socket() per sandbox id: asked twice per guest call, and pathlib joins cost more
    # than the rest of building the call (cleared past a bound; ids are never reused).
    _sockets: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def volumes_dir(self) -> Path:
        return self.config.data_dir / "volumes"

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.config.sandboxes_dir / sandbox_id

    def socket(self, sandbox_id: str) -> str:
        """The guest's listener: bound by the host in the sandbox's host-only directory
        (never in anything the sandbox can see), handed to the guest as fd 3."""
        path = self._sockets.get(sandbox_id)
        if path is None:
            if len(self._sockets) >= 4096:
                self._sockets.clear()
            path = self._sockets[sandbox_id] = str(self.sandbox_dir(sandbox_id) / "guest.sock")
        return path

    def volume(self, volume_id: str) -> Path:
        return self.volumes_dir / f"{volume_id}{self.volume_suffix}"

    def empty_file(self) -> Path:
        """A host-owned empty read-only file, mounted over what no sandbox may feed the
        guest's loader (/etc/ld.so.preload)."""
        path = self.config.data_dir / "empty"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o444)
            os.close(fd)
        return path

    def resolv_file(self) -> Path:
        """The sandbox's /etc/resolv.conf, host-owned and mounted read-only: the policy
        resolver. With the network off its address does not exist in the sandbox, so a
        lookup fails at once instead of waiting for a timeout."""
        path = self.config.data_dir / "resolv.conf"
        try:
            current = path.read_text()
        except OSError:
            current = None
        if current != RESOLV_CONF:
            tmp = path.with_name(f".resolv.conf.{os.getpid()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o444)
            try:
                os.write(fd, RESOLV_CONF.encode())
            finally:
                os.close(fd)
            os.replace(tmp, path)
        return path


class HostMode(Protocol):
    name: str
    layout: Layout
    cgroups: str  # what runc is told: "cgroupfs", "systemd" or "" (none)
    # Who owns files the host makes for the sandbox's root (None: the engine's user).
    sandbox_owner: int | None

    def prepare(self) -> None:
        """Make the data dir's folders, private to the engine and the sandboxes' root."""

    def enforced_limits(self) -> dict[str, bool]: ...

    def describe(self, enforced: dict[str, bool]) -> dict[str, Any]: ...

    def check_network(self) -> None:
        """Raise RuntimeUnavailableError when network=True cannot work here."""

    def assemble_base(self, folder: Path) -> Template: ...

    def new_volume(self, volume_id: str, size_mb: int) -> None: ...

    def attach(self, row: SandboxRecord) -> Path:
        """Make the sandbox's disk available; returns where its sys/ and workspace/ are."""

    def disk_root(self, row: SandboxRecord) -> Path: ...

    def workspace(self, row: SandboxRecord) -> Path:
        """Attach the disk; where the sandbox's /workspace is on the host."""

    def share_workspace(self, volume_id: str, lower: Path) -> None:
        """The volume's workspace/ holds the changes to ``lower``, a snapshot's copy."""

    def shared_workspaces(self) -> dict[str, str]:
        """Volume id -> the snapshot copy its workspace is over, for every such volume."""

    def shared_files(self, guest_dir: Path) -> SharedFiles:
        """Where the sandbox's read-only binds of host files come from (as root: a stage
        whose paths say nothing of the host's layout in the sandbox's mountinfo)."""

    def bundle(self, row: SandboxRecord, config: dict[str, Any]) -> dict[str, Any]:
        """Mount what the container's root needs and adapt the shared OCI config."""

    def unmount_root(self, row: SandboxRecord) -> None: ...

    def freeze(self, runc: Runc, sandbox_id: str, control: GuestClient) -> None: ...

    def thaw(self, runc: Runc, row: SandboxRecord, runc_status: str,
             control: GuestClient) -> None: ...

    def wipe_system_layer(self, system_dir: Path) -> None: ...

    def sweep_trash(self, disk_root: Path) -> None: ...

    def teardown(self, row: SandboxRecord, *, keep_volume: bool) -> None:
        """Unmount and detach everything of the sandbox's (the container is gone)."""

    def remove_volume(self, volume_id: str) -> None: ...

    def remove_tree(self, path: Path) -> None: ...

    # The rootless engine enters the sandbox's user namespace to set up its network.
    join_userns: bool

    def release_views(self, in_use: Any, wait: float | None = None) -> bool:
        """Drop host views of templates when ``in_use()`` says no sandbox needs them;
        ``wait``: at most this long for another process's hold on them (TimeoutError)."""

    def forget_views(self, lowers: list[str]) -> None:
        """A removed template's directories need no view any more."""

    def private_dir(self, path: Path) -> None: ...
