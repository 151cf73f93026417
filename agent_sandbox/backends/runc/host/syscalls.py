"""The few mount syscalls Python's stdlib lacks (mount, umount2 and idmapped mounts).

Idmapped mounts let every sandbox see host-owned template files (uid 0 on the host) as
owned by its own root, whose host id is unprivileged: overlay copy-up then works without
copying or chowning the 5 GB host /usr. Namespaces themselves are left to runc.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import time

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]

# x86_64 and aarch64 share these numbers (the "new mount API" is generic).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x00100000

MNT_DETACH = 2


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def mount(source: str, target: str, fstype: str, flags: int = 0, data: str = "") -> None:
    _check(
        _libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()),
        f"mount {fstype} on {target}",
    )


def umount(target: str, *, lazy: bool = False) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH if lazy else 0), f"umount {target}")


def fallocate(fd: int, length: int) -> None:
    """Allocate every block of the file's first ``length`` bytes (mode 0: holes filled,
    data kept). Unlike ``os.posix_fallocate`` it never falls back to writing zeros."""
    _check(_libc.fallocate(fd, 0, 0, length), "fallocate")


_ENTER_TIMEOUT = 10.0


class UsernsHolder:
    """A sleeping process in a fresh user namespace with the sandboxes' id mapping.

    Its namespace fd is what mount_setattr(MOUNT_ATTR_IDMAP) takes; an idmapped mount
    keeps its own reference, so the holder can exit once the mounts exist.
    """

    def __init__(self, host_base: int, size: int) -> None:
        self._proc = subprocess.Popen(
            ["unshare", "--user", "--", "sh", "-c", "read _"],
            stdin=subprocess.PIPE,
        )
        ns_path = f"/proc/{self._proc.pid}/ns/user"
        # Wait until unshare has entered the namespace (its ns link changes): a map written
        # before is refused (EPERM). Bounded in time, not in turns: on a loaded host
        # 2000 yields passed before unshare ran at all.
        own = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + _ENTER_TIMEOUT
        while os.readlink(ns_path) == own:
            if time.monotonic() > deadline or self._proc.poll() is not None:
                self._proc.kill()
                self._proc.wait()
                raise OSError(errno.ETIMEDOUT, "unshare --user did not enter a new user "
                              f"namespace within {_ENTER_TIMEOUT:g} s")
            os.sched_yield()
            time.sleep(0.0005)
        for kind in ("uid_map", "gid_map"):
            with open(f"/proc/{self._proc.pid}/{kind}", "w") as fh:
                fh.write(f"0 {host_base} {size}\n")
        self.fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        os.close(self.fd)
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait()

    def __enter__(self) -> UsernsHolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_detached(path: str, flags: int) -> int:
    """Open ``path`` through a private, detached copy of its directory's mount: the
    kernel then names the file ``/<its name>`` wherever it shows the file's path (a loop
    device's ``backing_file`` in sysfs, read by every sandbox), never where it lives."""
    folder, name = os.path.split(path)
    tree = _check(
        _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, folder.encode(),
                      _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC),
        f"open_tree {folder}",
    )
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=tree)
    finally:
        os.close(tree)


def idmapped_bind(source: str, target: str, userns_fd: int) -> None:
    """Mount a read-only, idmapped view of ``source`` at ``target`` (not recursive)."""
    fd = _check(
        _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, source.encode(),
                      _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC),
        f"open_tree {source}",
    )
    try:
        attr = _MountAttr(
            _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV,
            0, 0, userns_fd,
        )
        _check(
            _libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH, ctypes.byref(attr),
                          ctypes.sizeof(attr)),
            f"mount_setattr idmap {source}",
        )
        _check(
            _libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, target.encode(),
                          _MOVE_MOUNT_F_EMPTY_PATH),
            f"move_mount {source} -> {target}",
        )
    finally:
        os.close(fd)
