"""Rootless mode: the engine runs as an ordinary user. The user's own ids (and its
subordinate ranges) are the sandboxes', volumes are directories (no loop devices, no disk
quota), overlays are mounted by runc inside each container's user namespace, rlimits
stand in where no cgroup is delegated, and pause stops processes (no freezer)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_sandbox.backends.runc import host_paths
from agent_sandbox.backends.runc.host import rootless_setup as rootless
from agent_sandbox.backends.runc.host.mode import Layout, SharedFiles
from agent_sandbox.backends.runc.netproxy import namespace as netns
from agent_sandbox.backends.runc.oci import bundle as oci
from agent_sandbox.backends.runc.rootfs import disk
from agent_sandbox.backends.runc.rootfs import overlay as rootfs
from agent_sandbox.backends.runc.templates.base import user_copy_base
from agent_sandbox.config.engine import EngineConfig, Limits
from agent_sandbox.core.errors import RuntimeUnavailableError

if TYPE_CHECKING:
    from agent_sandbox.backends.runc.runc import Runc
    from agent_sandbox.core.templates import Template
    from agent_sandbox.guestlink.client import GuestClient
    from agent_sandbox.service.record import SandboxRecord


class RootlessHost:
    name = "rootless"
    join_userns = True
    sandbox_owner: int | None = None  # the sandbox's root is this user already

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.layout = Layout(config, "")

    @property
    def cgroups(self) -> str:
        return "systemd" if rootless.delegated_cgroup() else ""

    def prepare(self) -> None:
        rootless.check_usable()
        host_paths.require_usable(self.config.data_dir, None)
        for path in (self.config.data_dir, self.config.sandboxes_dir):
            path.mkdir(parents=True, exist_ok=True)
            self.private_dir(path)
        self.layout.volumes_dir.mkdir(mode=0o700, exist_ok=True)

    def private_dir(self, path: Path) -> None:
        os.chmod(path, 0o700)  # the sandboxes' root is this user: nobody else needs in

    def enforced_limits(self) -> dict[str, bool]:
        return rootless.enforced_limits()

    def describe(self, enforced: dict[str, bool]) -> dict[str, Any]:
        return {"mode": "rootless", "data_dir": str(self.config.data_dir),
                "ids": rootless.id_map().describe(), "enforced": enforced,
                "limits": rootless.describe_limits(),
                "pause": "SIGSTOP to every process but the guest (no freezer rootless)",
                "network": "loopback only, or a policy proxy run as the user"}

    def check_network(self) -> None:
        netns.check_tools()

    def assemble_base(self, folder: Path) -> Template:
        return user_copy_base(folder)

    # disks ------------------------------------------------------------------------------
    def new_volume(self, volume_id: str, size_mb: int) -> None:
        # A directory, made as the sandbox boots: no size limit, only the host's reserve.
        disk.check_free(self.layout.volumes_dir, self.config.host_reserve_mb)

    def disk_root(self, row: SandboxRecord) -> Path:
        return self.layout.volume(row.volume_id)

    def attach(self, row: SandboxRecord) -> Path:
        root = self.disk_root(row)
        rootless.make_volume(root)
        return root

    def workspace(self, row: SandboxRecord) -> Path:
        return self.attach(row) / disk.WORKSPACE

    def share_workspace(self, volume_id: str, lower: Path) -> None:
        raise RuntimeUnavailableError("memory snapshots need the root engine")

    def shared_workspaces(self) -> dict[str, str]:
        return {}

    def shared_files(self, guest_dir: Path) -> SharedFiles:
        # Bound from where they are: a user cannot mount a stage on the host (and the
        # volume's and run dir's binds name the user's data dir anyway).
        return SharedFiles(str(guest_dir), str(self.layout.empty_file()),
                           str(self.layout.resolv_file()))

    def bundle(self, row: SandboxRecord, config: dict[str, Any]) -> dict[str, Any]:
        # Overlays are mounted by runc inside the container's user namespace; the run dir
        # is a plain directory (no tmpfs without root: no size limit).
        (self.layout.sandbox_dir(row.id) / "rootfs").mkdir(exist_ok=True)
        limits = Limits(**row.limits)
        cgroups = bool(self.cgroups)
        out = oci.to_rootless(config, oci.UserHost(
            id_map=rootless.id_map().oci(),
            rootfs_mounts=tuple(rootfs.overlay_mounts(self.disk_root(row) / disk.SYSTEM,
                                                      row.layers)),
            rlimits=tuple(rootless.rlimits(limits, cgroups=cgroups)),
            cgroups=self.cgroups))
        out["process"]["env"] += rootless.guest_env(limits, cgroups=cgroups)
        return out

    def unmount_root(self, row: SandboxRecord) -> None:
        return None  # runc mounted it inside the container: gone with it

    # states -----------------------------------------------------------------------------
    def freeze(self, runc: Runc, sandbox_id: str, control: GuestClient) -> None:
        control.freeze()

    def thaw(self, runc: Runc, row: SandboxRecord, runc_status: str,
             control: GuestClient) -> None:
        if row.state == "paused":
            control.thaw()

    # teardown ---------------------------------------------------------------------------
    def wipe_system_layer(self, system_dir: Path) -> None:
        rootfs.wipe_system_layer(system_dir, owner=None, remove=self.remove_tree)

    def sweep_trash(self, disk_root: Path) -> None:
        rootfs.sweep_trash(disk_root, remove=self.remove_tree)

    def teardown(self, row: SandboxRecord, *, keep_volume: bool) -> None:
        if keep_volume:  # nothing is mounted on the host: the volume is a directory
            self.wipe_system_layer(self.disk_root(row) / disk.SYSTEM)

    def remove_volume(self, volume_id: str) -> None:
        self.remove_tree(self.layout.volume(volume_id))

    def remove_tree(self, path: Path) -> None:
        rootless.remove_tree(path)  # sandboxes wrote it with subordinate ids too

    def release_views(self, in_use: Any, wait: float | None = None) -> bool:
        return not in_use()

    def forget_views(self, lowers: list[str]) -> None:
        return None
