"""Assembles a sandbox's root filesystem: one overlay per template layer.

Lowers are idmapped read-only views of template directories (host uid 0 shows as the
sandbox's root); uppers live on the sandbox's own disk under ``sys/``, so wiping that
directory is all ``reset_rootfs`` needs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent_sandbox.backends.runc.host import syscalls
from agent_sandbox.config.engine import HOST_ID_BASE, HOST_ID_COUNT

_MS_NOSUID, _MS_NODEV, _MS_NOATIME = 2, 4, 1024
_DIR_REF = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextmanager
def file_lock(path: Path, wait: float | None = None) -> Iterator[None]:
    """An exclusive flock on ``path`` (other processes: views are shared). ``wait``: at
    most this many seconds, then TimeoutError, instead of as long as its holder likes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        if wait is None:
            fcntl.flock(fh, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"{path} is held by another process") from None
                    time.sleep(0.02)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class IdmapViews:
    """Idmapped read-only views of template directories, mounted once per boot."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._known: dict[str, str] = {}

    def view(self, host_path: str) -> str:
        self.prepare([host_path])
        return self._known[host_path]

    def prepare(self, paths: list[str]) -> None:
        """Mount every missing view with one user namespace (cheaper than one each).
        A view's directory exists only while it is mounted (``release`` removes both), so
        one another process released is seen as missing here."""
        missing = [p for p in paths if not os.path.isdir(self._known.get(p, "\0"))]
        if not missing:
            return
        with file_lock(self.root / ".lock"):
            mounted = set(mounts_under(self.root))
            todo = []
            for host_path in missing:
                name = hashlib.sha256(host_path.encode()).hexdigest()[:16]
                target = self.root / name
                if str(target) not in mounted:
                    todo.append((host_path, target))
                self._known[host_path] = str(target)
            if todo:
                with syscalls.UsernsHolder(HOST_ID_BASE, HOST_ID_COUNT) as ns:
                    for host_path, target in todo:
                        target.mkdir(parents=True, exist_ok=True)
                        syscalls.idmapped_bind(host_path, str(target), ns.fd)


    def forget(self, host_paths: list[str]) -> None:
        """Unmount the views of template directories that are gone."""
        if not self.root.is_dir():
            return
        with file_lock(self.root / ".lock"):
            mounted = set(mounts_under(self.root))
            for host_path in host_paths:
                target = self.root / hashlib.sha256(host_path.encode()).hexdigest()[:16]
                self._known.pop(host_path, None)
                if str(target) in mounted:
                    syscalls.umount(str(target), lazy=True)

    def release(self, in_use: Callable[[], bool] = lambda: False,
                wait: float | None = None, also: tuple[Path, ...] = ()) -> bool:
        """Unmount and remove every view unless ``in_use()`` says a sandbox still needs
        one (checked under the views' lock: a create records its sandbox before it
        prepares views). Returns whether they were released. ``wait``: for the lock at
        most this long (TimeoutError), as ``file_lock``. ``also``: other shared mounts
        prepared under this lock, unmounted with the views."""
        if not self.root.is_dir() and not any(p.is_dir() for p in also):
            self._known.clear()  # nothing mounted; making the lock's dir would leave it behind
            return True
        with file_lock(self.root / ".lock", wait):
            if in_use():
                return False
            for other in also:
                unmount_rootfs(other)
            unmount_rootfs(self.root)
            for entry in os.scandir(self.root) if self.root.is_dir() else []:
                if entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.rmdir(entry.path)  # empty now; never recursive
            self._known.clear()
            return True


def _layer_dirs(system_dir: Path, index: int) -> tuple[Path, Path]:
    return system_dir / "upper" / str(index), system_dir / "work" / str(index)


SHARED = "shared"  # a layer's top lowers already in the sandboxes' ids: no idmapped view


def lowers_of(layer: dict[str, Any]) -> list[str]:
    """Every lower of a layer, top first: the shared ones (a snapshot's system layer, read
    by its forks) above the template's."""
    return [*layer.get(SHARED, ()), *layer["lowers"]]


def mount_rootfs(rootfs: Path, system_dir: Path, layers: list[dict[str, Any]],
                 views: IdmapViews) -> None:
    """Mount every layer's overlay under ``rootfs`` (``/`` first, then deeper targets).
    A layer's ``SHARED`` lowers are host directories of the sandboxes' own ids (copies a
    snapshot made of a system layer), used as they are, above its template's views."""
    views.prepare([lower for layer in layers for lower in layer["lowers"]])
    rootfs.mkdir(parents=True, exist_ok=True)
    for index in _layer_order(layers):
        layer = layers[index]
        upper, work = _layer_dirs(system_dir, index)
        for path in (upper, work):
            if not path.exists():
                path.mkdir(parents=True)
                os.chown(path, HOST_ID_BASE, HOST_ID_BASE)
        target = rootfs / layer["target"].lstrip("/")
        if os.path.ismount(target):
            continue
        dirs = [*layer.get(SHARED, ()), *(views.view(lower) for lower in layer["lowers"]),
                str(upper), str(work)]
        # Every layer named by a descriptor of ours: the sandbox reads the options in its
        # mountinfo, and sees /proc/self/fd/N instead of where the host keeps its files.
        fds = [os.open(d, _DIR_REF) for d in dirs]
        try:
            *lowers, up, wk = (f"/proc/self/fd/{fd}" for fd in fds)
            # nosuid: nothing a sandbox leaves setuid means anything on the host's view.
            syscalls.mount("overlay", str(target), "overlay", _MS_NOSUID | _MS_NODEV,
                           f"lowerdir={':'.join(lowers)},upperdir={up},workdir={wk}")
        finally:
            for fd in fds:
                os.close(fd)


def _layer_order(layers: list[dict[str, Any]]) -> list[int]:
    return sorted(range(len(layers)), key=lambda i: layers[i]["target"].count("/")
                  if layers[i]["target"] != "/" else 0)


def overlay_mounts(system_dir: Path, layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rootless: the same overlays as OCI ``mounts`` entries, which runc mounts inside the
    container's user namespace (``userxattr``: overlay's own xattrs in the user.*
    namespace). Lowers are used as they are: rootless templates are the user's files."""
    out = []
    for index in _layer_order(layers):
        layer = layers[index]
        upper, work = _layer_dirs(system_dir, index)
        for path in (upper, work):
            path.mkdir(parents=True, exist_ok=True)
        lowers = ":".join(lowers_of(layer))
        out.append({"destination": layer["target"], "type": "overlay", "source": "overlay",
                    "options": ["nosuid", "nodev", f"lowerdir={lowers}", f"upperdir={upper}",
                                f"workdir={work}", "userxattr"]})
    return out


def mount_shared_workspace(target: Path, lower: Path, volume_root: Path) -> None:
    """/workspace of a sandbox started from a snapshot: the snapshot's copy of it
    (read-only, shared by every fork) under the sandbox's own ``workspace/`` on its disk,
    which takes every change (and its size limit)."""
    if os.path.ismount(target):
        return
    target.mkdir(mode=0o700, exist_ok=True)
    work = volume_root / ".workspace-work"  # beside the upper, as overlay needs
    if not work.is_dir():
        work.mkdir(mode=0o700)
    upper = volume_root / "workspace"
    fds = [os.open(d, _DIR_REF) for d in (lower, upper, work)]
    try:
        low, up, wk = (f"/proc/self/fd/{fd}" for fd in fds)
        # The disk's own flags (disk.py): a checkpoint of either restores onto the other,
        # and CRIU cannot change the atime flags of a mount locked in the sandbox's userns.
        syscalls.mount("overlay", str(target), "overlay", _MS_NOSUID | _MS_NODEV | _MS_NOATIME,
                       f"lowerdir={low},upperdir={up},workdir={wk}")
    finally:
        for fd in fds:
            os.close(fd)


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or below ``prefix``, from the kernel's table (``os.path.ismount``
    misses bind mounts of the same filesystem, such as idmapped views of /usr)."""
    top = str(prefix)
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mountpoint = line.split()[4].replace("\\040", " ")
            if mountpoint == top or mountpoint.startswith(top + "/"):
                found.append(mountpoint)
    return found


def unmount_rootfs(rootfs: Path) -> None:
    """Unmount everything at or below ``rootfs``, deepest (and latest) first."""
    for target in sorted(mounts_under(rootfs), key=len, reverse=True):
        try:
            syscalls.umount(target)
        except OSError:
            syscalls.umount(target, lazy=True)


_TRASH = ".trash-"


def wipe_system_layer(system_dir: Path, *, owner: int | None,
                      remove: Callable[[Path], None]) -> None:
    """Throw the system layer away: rename (instant), then delete. ``owner``: who the
    fresh layer belongs to (the sandboxes' root), None for the engine's own user."""
    if not system_dir.exists():
        return
    trash = system_dir.with_name(f"{_TRASH}{os.getpid()}-{os.urandom(4).hex()}")
    os.replace(system_dir, trash)
    system_dir.mkdir()
    if owner is not None:
        os.chown(system_dir, owner, owner)
    remove(trash)


def sweep_trash(volume_root: Path, *, remove: Callable[[Path], None]) -> None:
    """Delete system layers a crashed wipe renamed but never removed (the sandbox cannot
    see the volume's root, so these are ours)."""
    try:
        leftovers = [e for e in os.scandir(volume_root)
                     if e.name.startswith(_TRASH) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for entry in leftovers:
        remove(Path(entry.path))
