"""Host access to trees a sandbox can write, without following anything it planted.

The host never resolves a path inside a sandbox-writable directory with plain ``open()``:
a sandbox's root can replace any entry with a symlink (to ``/etc/shadow``, to a host
socket, to another sandbox's files) between our check and our use. Every such access goes
through ``openat2`` relative to a directory descriptor, refusing symlinks, magic links,
``..`` escapes and mount crossings (``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV``), and unix sockets are connected through the
descriptor of the inode that was checked (``/proc/self/fd/N``), never by name.
"""

from __future__ import annotations

import ctypes
import os
import socket
import stat
from pathlib import Path

from agent_sandbox.core.errors import RuntimeUnavailableError

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_SYS_OPENAT2 = 437  # x86_64 and aarch64 alike (generic syscall table)

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
STRICT = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


class UnsafePathError(OSError):
    """The entry is not what the host expects (a link, another file type, another mount)."""


def openat2(dirfd: int, name: str, flags: int, mode: int = 0, resolve: int = STRICT) -> int:
    """``openat2(2)``: ``name`` resolved beneath ``dirfd`` under the ``resolve`` rules."""
    if not (flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE):
        mode = 0  # openat2 refuses a mode it would not use (O_TMPFILE includes O_DIRECTORY)
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    fd = _libc.syscall(_SYS_OPENAT2, dirfd, name.encode(), ctypes.byref(how),
                       ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        if err == 38:  # ENOSYS: kernels before 5.6
            raise RuntimeUnavailableError("this kernel has no openat2 (Linux >= 5.6 is needed "
                                          "to touch sandbox files safely)")
        if err == 40:  # ELOOP: a symlink or magic link on the way
            raise UnsafePathError(err, f"{name}: a link where a plain entry was expected")
        if err == 18:  # EXDEV: a mount crossing, or '..' out of the directory
            raise UnsafePathError(err, f"{name}: leaves the directory it must stay in")
        raise OSError(err, f"{name}: {os.strerror(err)}")
    return int(fd)


def open_dir(path: str | Path) -> int:
    """An ``O_PATH`` descriptor of a host-owned directory (its own name is the host's: no
    component of it is writable by a sandbox; the final one must not be a link)."""
    return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_beneath(dirfd: int, name: str, flags: int, mode: int = 0o600) -> int:
    """Open ``name`` (relative, no links, same mount) under ``dirfd``."""
    return openat2(dirfd, name, flags | os.O_NOFOLLOW, mode)


def socket_ref(dirfd: int, name: str) -> int:
    """An ``O_PATH`` descriptor of the unix socket ``name`` under ``dirfd``, checked to be a
    socket on the directory's own filesystem (so bound by the sandbox or the host there,
    never a host socket reached through a link or a hard link from elsewhere)."""
    fd = openat2(dirfd, name, os.O_PATH | os.O_NOFOLLOW)
    try:
        st, dst = os.fstat(fd), os.fstat(dirfd)
        if not stat.S_ISSOCK(st.st_mode):
            raise UnsafePathError(20, f"{name}: not a socket")
        if st.st_dev != dst.st_dev:
            raise UnsafePathError(18, f"{name}: on another filesystem")
    except BaseException:
        os.close(fd)
        raise
    return fd


def fd_path(fd: int) -> str:
    """The name that reaches exactly the inode behind ``fd`` (for connect(2) and ZeroMQ)."""
    return f"/proc/self/fd/{fd}"


def connect_unix(dirfd: int, name: str, timeout: float | None) -> socket.socket:
    """A stream connection to the socket ``name`` under ``dirfd`` (see ``socket_ref``)."""
    ref = socket_ref(dirfd, name)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(fd_path(ref))
    except BaseException:
        sock.close()
        raise
    finally:
        os.close(ref)
    return sock


def unlink_beneath(dirfd: int, name: str) -> None:
    """Remove ``name`` (a plain name in ``dirfd``; a link is removed, never followed)."""
    if "/" in name or name in ("", ".", ".."):
        raise UnsafePathError(22, f"{name!r}: not a plain name")
    try:
        os.unlink(name, dir_fd=dirfd)
    except FileNotFoundError:
        pass
