"""A build step's layer read out of a sandbox's overlay upper directory, trusting nothing.

The upper directory is what the sandbox wrote: every entry is hostile. It is walked by
directory descriptors only (``openat2`` beneath the parent, no symlink, no magic link, no
mount crossing), each file is opened without following anything and checked to be the
inode that was listed, and the copy is bounded in bytes, entries and depth. What is kept
follows the image importer (``oci/layers.py``): symlinks are copied as links (only ever
read inside a sandbox), overlay whiteouts (0/0 character devices) and opaque directories
are kept, other device nodes and sockets are dropped, setuid bits are kept (the template
store is the engine's alone and every overlay is mounted nosuid on the host's side), a
hard link is kept only between files of the layer itself: a file linked from anywhere
else refuses the layer. Owners are mapped back from the sandboxes' host id range (the
sandbox's root is host uid ``HOST_ID_BASE``) to template ids (host uid 0 is its root).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

from agent_sandbox.backends.runc.rootfs.confined import UnsafePathError, openat2
from agent_sandbox.config.engine import HOST_ID_BASE, HOST_ID_COUNT
from agent_sandbox.core.errors import InvalidArgumentError, ResourceExhaustedError

NOBODY = 65534
_OPAQUE = ("trusted.overlay.opaque", "user.overlay.opaque")
# Overlay features that make an upper entry mean something other than its bytes.
_REFUSED_XATTRS = ("trusted.overlay.metacopy", "trusted.overlay.redirect",
                   "user.overlay.metacopy", "user.overlay.redirect")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
_CHUNK = 1 << 20


@dataclass
class Budget:
    """What one layer may hold."""

    max_bytes: int
    what: str = "the step's layer (the build's layer limit)"
    max_entries: int = 1_000_000
    max_depth: int = 128  # three Python frames a level: well within the recursion limit
    bytes: int = 0
    entries: int = 0
    # (dev, ino) of a multiply linked file -> (its copy's path in the layer, links seen)
    links: dict[tuple[int, int], list] = field(default_factory=dict)
    root_fd: int = -1  # the copy's top directory (where a second link's first name is)
    # Paths (``/a/b`` from the copy's top) left out: what the engine mounts over, which
    # runc made as empty mount points in the upper dir.
    skip: frozenset[str] = frozenset()
    mode: int | None = None  # COPY --chmod: every copied entry's permission bits

    def count(self, size: int = 0) -> None:
        self.entries += 1
        self.bytes += size
        if self.entries > self.max_entries:
            raise ResourceExhaustedError(f"{self.what} has over {self.max_entries} entries")
        if self.bytes > self.max_bytes:
            raise ResourceExhaustedError(f"{self.what} is over {self.max_bytes >> 20} MiB")


def template_id(host_id: int) -> int:
    """A sandbox-side owner (host ``HOST_ID_BASE + n``) as the template's ``n``."""
    if HOST_ID_BASE <= host_id < HOST_ID_BASE + HOST_ID_COUNT:
        return host_id - HOST_ID_BASE
    return NOBODY


Ids = Callable[[os.stat_result], tuple[int, int]]


def sandbox_ids(st: os.stat_result) -> tuple[int, int]:
    return template_id(st.st_uid), template_id(st.st_gid)


def copy_upper(src_fd: int, dst_fd: int, budget: Budget) -> None:
    """Copy the tree under ``src_fd`` (a sandbox's upper dir) into ``dst_fd`` (an empty
    directory of ours), then check every hard link stayed inside the layer."""
    copy_tree(src_fd, dst_fd, budget, sandbox_ids, whiteouts=True)
    for (_dev, _ino), (path, seen, nlink) in budget.links.items():
        if seen != nlink:
            raise InvalidArgumentError(f"refusing the layer: {path} is hard linked to a file "
                                       "outside it")


def _xattr(fd: int, name: str) -> bytes | None:
    try:
        return os.getxattr(fd, name)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EPERM):
            return None
        raise


def _check_plain(fd: int, rel: str) -> None:
    for name in _REFUSED_XATTRS:
        if _xattr(fd, name) is not None:
            raise InvalidArgumentError(f"refusing the layer: {rel} is an overlay {name} "
                                       "entry (the engine needs metacopy and redirect_dir off)")


def copy_tree(src_fd: int, dst_fd: int, budget: Budget, ids: Ids, *, whiteouts: bool,
              rel: str = "", depth: int = 0) -> None:
    """Copy the entries of the directory ``src_fd`` into the directory ``dst_fd``.
    ``whiteouts``: 0/0 character devices are overlay whiteouts to keep (an upper dir),
    and hard links are kept within the copy (and refused from outside it)."""
    if depth > budget.max_depth:
        raise InvalidArgumentError(f"refusing the layer: {rel} is nested over "
                                   f"{budget.max_depth} directories deep")
    names = []
    with os.scandir(src_fd) as it:
        for entry in it:  # counted as listed: a directory of millions is refused early
            if budget.entries + len(names) >= budget.max_entries:
                raise ResourceExhaustedError(f"{budget.what} has over {budget.max_entries} "
                                             "entries")
            names.append(entry.name)
    for name in names:
        copy_entry(src_fd, dst_fd, name, name, budget, ids, whiteouts=whiteouts,
                   rel=rel, depth=depth)


def copy_entry(src_fd: int, dst_fd: int, name: str, dst_name: str, budget: Budget,
               ids: Ids, *, whiteouts: bool, rel: str = "", depth: int = 0) -> None:
    """Copy the entry ``name`` of ``src_fd`` as ``dst_name`` in ``dst_fd`` (replacing a
    directory's metadata where one is there already)."""
    path = f"{rel}/{name}"
    if path in budget.skip:
        return
    st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
    budget.count(st.st_size if stat.S_ISREG(st.st_mode) else 0)
    uid, gid = ids(st)
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        _copy_subdir(src_fd, dst_fd, name, dst_name, st, budget, ids, whiteouts, path, depth)
        return
    if stat.S_ISREG(mode):
        if whiteouts and _link_seen(dst_name, st, budget, path):
            return
        _copy_file(src_fd, dst_fd, name, dst_name, st, path)
    elif stat.S_ISLNK(mode):
        os.symlink(os.readlink(name, dir_fd=src_fd), dst_name, dir_fd=dst_fd)
    elif whiteouts and stat.S_ISCHR(mode) and st.st_rdev == 0:
        os.mknod(dst_name, stat.S_IFCHR, 0, dir_fd=dst_fd)  # a whiteout
    elif stat.S_ISFIFO(mode):
        os.mkfifo(dst_name, 0o600, dir_fd=dst_fd)
    else:
        return  # device nodes and sockets mean nothing in a template
    os.chown(dst_name, uid, gid, dir_fd=dst_fd, follow_symlinks=False)
    if not stat.S_ISLNK(mode):
        bits = stat.S_IMODE(mode) if budget.mode is None else budget.mode
        os.chmod(dst_name, bits, dir_fd=dst_fd)  # after chown (which clears setuid)
    os.utime(dst_name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst_fd,
             follow_symlinks=False)


def _same(fd: int, st: os.stat_result, path: str) -> os.stat_result:
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or \
            stat.S_IFMT(now.st_mode) != stat.S_IFMT(st.st_mode):
        raise UnsafePathError(errno.ESTALE, f"{path} changed while the layer was read")
    return now


def _copy_subdir(src_fd: int, dst_fd: int, name: str, dst_name: str, st: os.stat_result,
                 budget: Budget, ids: Ids, whiteouts: bool, path: str, depth: int) -> None:
    child = openat2(src_fd, name, _DIR)
    try:
        _same(child, st, path)
        _check_plain(child, path)
        try:
            os.mkdir(dst_name, 0o700, dir_fd=dst_fd)
        except FileExistsError:
            pass  # a directory made for an earlier entry (openat2 refuses anything else)
        out = openat2(dst_fd, dst_name, _DIR)
        try:
            copy_tree(child, out, budget, ids, whiteouts=whiteouts, rel=path, depth=depth + 1)
            opaque = next((v for v in (_xattr(child, n) for n in _OPAQUE) if v), None)
            if whiteouts and opaque == b"y":
                os.setxattr(out, "trusted.overlay.opaque", b"y")
            os.fchown(out, *ids(st))
            os.fchmod(out, stat.S_IMODE(st.st_mode) if budget.mode is None else budget.mode)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(child)


def _link_seen(name: str, st: os.stat_result, budget: Budget, path: str) -> bool:
    """A further name of a multiply linked file already copied: linked to its copy."""
    if st.st_nlink <= 1:
        return False
    key = (st.st_dev, st.st_ino)
    known = budget.links.get(key)
    if known is None:
        budget.links[key] = [path, 1, st.st_nlink]
        return False
    known[1] += 1
    # Both names are in our own copy, made of real directories only.
    os.link(known[0].lstrip("/"), path.lstrip("/"), src_dir_fd=budget.root_fd,
            dst_dir_fd=budget.root_fd, follow_symlinks=False)
    return True


def _copy_file(src_fd: int, dst_fd: int, name: str, dst_name: str, st: os.stat_result,
               path: str) -> None:
    src = openat2(src_fd, name, _FILE)
    try:
        _same(src, st, path)
        _check_plain(src, path)
        out = os.open(dst_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=dst_fd)
        try:
            left = st.st_size
            while True:
                chunk = os.read(src, _CHUNK)
                if not chunk:
                    break
                left -= len(chunk)
                if left < 0:  # grew since it was listed (the sandbox is frozen: never)
                    raise UnsafePathError(errno.EFBIG, f"{path} grew while it was read")
                os.write(out, chunk)
        finally:
            os.close(out)
    finally:
        os.close(src)


def capture(upper: str, dest: str, budget: Budget) -> None:
    """Copy the upper directory ``upper`` (the host's own path to it) into the new
    directory ``dest``."""
    src = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.mkdir(dest, 0o755)
        dst = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        budget.root_fd = dst
        try:
            copy_upper(src, dst, budget)
        finally:
            os.close(dst)
    finally:
        os.close(src)
