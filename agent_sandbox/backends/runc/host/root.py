"""Root mode: sandboxes' root is one unprivileged host id range, their disks are loop-mounted
ext4 images, their root filesystems overlays the host mounts over idmapped template views."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_sandbox.backends.runc import checkpoint, criu, host_paths
from agent_sandbox.backends.runc.host import subids, syscalls
from agent_sandbox.backends.runc.host.mode import Layout, SharedFiles
from agent_sandbox.backends.runc.netproxy import namespace as netns
from agent_sandbox.backends.runc.rootfs import disk
from agent_sandbox.backends.runc.rootfs import overlay as rootfs
from agent_sandbox.backends.runc.stage import Stage
from agent_sandbox.backends.runc.templates.base import host_view_base
from agent_sandbox.config.engine import HOST_ID_BASE, EngineConfig

if TYPE_CHECKING:
    from agent_sandbox.backends.runc.runc import Runc
    from agent_sandbox.core.templates import Template
    from agent_sandbox.guestlink.client import GuestClient
    from agent_sandbox.service.record import SandboxRecord

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_LOWER = ".lower"  # beside a volume's image: the snapshot copy its workspace/ is over


class RootHost:
    name = "root"
    join_userns = False
    cgroups = "cgroupfs"
    sandbox_owner: int | None = HOST_ID_BASE

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.layout = Layout(config, ".img")
        self.views = rootfs.IdmapViews(config.idmap_dir)
        self.stage = Stage(config.data_dir / "stage",
                           lambda: rootfs.file_lock(config.idmap_dir / ".lock"))

    def prepare(self) -> None:
        host_paths.require_usable(self.config.data_dir, HOST_ID_BASE)
        subids.reserve()  # keep useradd's subordinate ranges off our host ids
        host_paths.make_dirs(self.config.data_dir.parent)  # traversable, whatever the umask
        for path in (self.config.data_dir, self.config.sandboxes_dir):
            path.mkdir(exist_ok=True)
            self.private_dir(path)
        self.layout.volumes_dir.mkdir(mode=0o700, exist_ok=True)
        self.config.idmap_dir.mkdir(mode=0o700, exist_ok=True)

    def private_dir(self, path: Path) -> None:
        """root:HOST_ID_BASE 0710: the sandboxes' unprivileged root must traverse to its
        rootfs; no other host user may enter (setuid files, sockets, disks below)."""
        os.chown(path, 0, HOST_ID_BASE)
        os.chmod(path, 0o710)

    def enforced_limits(self) -> dict[str, bool]:
        return enforced_limits()

    def describe(self, enforced: dict[str, bool]) -> dict[str, Any]:
        return {"mode": "root", "data_dir": str(self.config.data_dir),
                "ids": f"0 -> {HOST_ID_BASE} (65536 ids, shared by all sandboxes)",
                "enforced": enforced,
                "limits": {name: ("cgroup" if on else "not enforced (controller missing)")
                           if name != "disk" else "ext4 image per sandbox"
                           for name, on in enforced.items()},
                "pause": "checkpoint to disk (CRIU), memory freed" if criu.find().ok
                else f"cgroup freezer (no memory snapshots: {criu.problem()})",
                "network": "loopback only, or a policy proxy (backends/runc/netproxy)"}

    def check_network(self) -> None:
        netns.check_tools()

    def assemble_base(self, folder: Path) -> Template:
        return host_view_base(folder)

    # disks ------------------------------------------------------------------------------
    def new_volume(self, volume_id: str, size_mb: int) -> None:
        disk.create_image(self.layout.volume(volume_id), size_mb,
                          self.config.data_dir / "blank", self.config.host_reserve_mb)

    def disk_root(self, row: SandboxRecord) -> Path:
        return self.layout.sandbox_dir(row.id) / "disk"

    def attach(self, row: SandboxRecord) -> Path:
        root = self.disk_root(row)
        disk.attach(self.layout.volume(row.volume_id), root, self.config.host_reserve_mb)
        return root

    def workspace(self, row: SandboxRecord) -> Path:
        """Where the sandbox's /workspace is on the host: its disk's ``workspace/``, or for
        a volume made by a fork, that over its snapshot's copy (``share_workspace``)."""
        root = self.attach(row)
        lower = self._shared_workspace(row.volume_id)
        if lower is None:
            return root / disk.WORKSPACE
        target = self.layout.sandbox_dir(row.id) / disk.WORKSPACE
        rootfs.mount_shared_workspace(target, lower, root)
        return target

    def share_workspace(self, volume_id: str, lower: Path) -> None:
        """The volume's ``workspace/`` holds only changes to ``lower`` (a snapshot's copy
        of /workspace, read-only): recorded beside the volume, which is kept with it."""
        fd = os.open(self._lower_record(volume_id),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, str(lower).encode())
        finally:
            os.close(fd)

    def shared_workspaces(self) -> dict[str, str]:
        """Every volume's shared /workspace (``share_workspace``): volume id -> lower."""
        out = {}
        for path in self.layout.volumes_dir.glob(f"*{_LOWER}"):
            try:
                out[path.name[:-len(_LOWER)]] = path.read_text()
            except OSError:
                continue
        return out

    def _lower_record(self, volume_id: str) -> Path:
        return self.layout.volumes_dir / f"{volume_id}{_LOWER}"

    def _shared_workspace(self, volume_id: str) -> Path | None:
        try:
            return Path(self._lower_record(volume_id).read_text())  # host-written
        except FileNotFoundError:
            return None

    def shared_files(self, guest_dir: Path) -> SharedFiles:
        return self.stage.files(guest_dir)

    def bundle(self, row: SandboxRecord, config: dict[str, Any]) -> dict[str, Any]:
        sbdir = self.layout.sandbox_dir(row.id)
        rootfs.mount_rootfs(sbdir / "rootfs", sbdir / "disk" / disk.SYSTEM, row.layers,
                            self.views)
        # The guest's socket and the kernels' files live on a tiny tmpfs: the sandbox
        # sees this directory, and must not be able to fill the host's disk through it.
        run_dir = sbdir / "run"
        if not os.path.ismount(run_dir):
            syscalls.mount("tmpfs", str(run_dir), "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                           f"size=4m,nr_inodes=1024,mode=0700,uid={HOST_ID_BASE},"
                           f"gid={HOST_ID_BASE}")
        checkpoint.annotate(config, sbdir)  # where a checkpoint's CRIU options will be
        return config

    def unmount_root(self, row: SandboxRecord) -> None:
        rootfs.unmount_rootfs(self.layout.sandbox_dir(row.id) / "rootfs")

    # states -----------------------------------------------------------------------------
    def freeze(self, runc: Runc, sandbox_id: str, control: GuestClient) -> None:
        runc.pause(sandbox_id)

    def thaw(self, runc: Runc, row: SandboxRecord, runc_status: str,
             control: GuestClient) -> None:
        if runc_status == "paused":
            runc.resume(row.id)

    # teardown ---------------------------------------------------------------------------
    def wipe_system_layer(self, system_dir: Path) -> None:
        rootfs.wipe_system_layer(system_dir, owner=HOST_ID_BASE, remove=self.remove_tree)

    def sweep_trash(self, disk_root: Path) -> None:
        rootfs.sweep_trash(disk_root, remove=self.remove_tree)

    def teardown(self, row: SandboxRecord, *, keep_volume: bool) -> None:
        sbdir = self.layout.sandbox_dir(row.id)
        rootfs.unmount_rootfs(sbdir / "rootfs")
        rootfs.unmount_rootfs(sbdir / disk.WORKSPACE)  # a shared one's overlay, on the disk
        mnt = sbdir / "disk"
        if keep_volume and os.path.ismount(mnt):
            self.wipe_system_layer(mnt / disk.SYSTEM)
            disk.trim(mnt)
        disk.detach(mnt)
        rootfs.unmount_rootfs(sbdir)  # the run tmpfs, and anything left over

    def remove_volume(self, volume_id: str) -> None:
        self.layout.volume(volume_id).unlink(missing_ok=True)
        self._lower_record(volume_id).unlink(missing_ok=True)

    def remove_tree(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)  # fd-based: no link in it is followed

    def release_views(self, in_use: Any, wait: float | None = None) -> bool:
        return self.views.release(in_use, wait, also=(self.stage.root,))

    def forget_views(self, lowers: list[str]) -> None:
        self.views.forget(lowers)


def enforced_limits() -> dict[str, bool]:
    """Which limits this host really enforces: each needs its cgroup controller (v1
    directory, or listed in the v2 root's controllers); disk is a filesystem per sandbox."""
    root = Path("/sys/fs/cgroup")
    v2 = (root / "cgroup.controllers").read_text().split() \
        if (root / "cgroup.controllers").exists() else []

    def has(v1: str, v2_name: str) -> bool:
        return (root / v1).is_dir() or v2_name in v2

    return {"memory": has("memory", "memory"), "pids": has("pids", "pids"),
            "cpu": has("cpu", "cpu"), "disk": True}
