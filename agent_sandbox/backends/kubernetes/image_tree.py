"""Flatten a template's overlay layers into the members of one image layer.

Each layer is a mount target and its overlay lowers (first on top). As the overlay mounts
would: a deeper target hides what shallower layers hold there; in one layer, an upper
lower's entry hides the same name below it, directories merge, an overlay whiteout (a 0/0
character device) hides the name, and an opaque directory (``trusted.overlay.opaque`` or
``user.overlay.opaque`` = ``y``) hides what lowers below hold under it. Whiteouts are never
written: the image has one layer, nothing under it to hide.

Every read is relative to an open directory, one name at a time, without following a
symlink (O_NOFOLLOW, ``dir_fd``): a symlink anywhere in a template, absolute or not, is
stored as a symlink and never read through. ``extra`` entries (the guest agent, required
directories) are laid over the result.
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import stat
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

_OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_MAX_LINK_HOPS = 40


@dataclass
class Extra:
    """An entry laid over the template. ``replace``: a directory whose template contents
    are dropped (only its ``extra`` children remain); otherwise a template directory of
    that name is kept as it is and only a missing one (or a non-directory) is made."""

    mode: int
    data: bytes | None = None  # None: a directory
    replace: bool = False


@dataclass
class Entry:
    """What the image holds at a path (kept for the checks after writing)."""

    kind: str  # dir | file | link | hardlink | fifo
    mode: int = 0
    target: str = ""  # symlink or hard link target


ProgressFn = Callable[[int, int], None]  # (entries, bytes of file data)


@dataclass
class Flattener:
    layers: list[tuple[str, list[str]]]  # (target, lowers top first)
    extra: dict[str, Extra] = field(default_factory=dict)  # relative path -> entry
    progress: ProgressFn | None = None
    # Files of this uid/gid are stored as root's (a rootless user's own templates).
    owner_as_root: tuple[int, int] | None = None
    index: dict[str, Entry] = field(default_factory=dict)
    data_bytes: int = 0
    _links: dict[tuple[int, int], str] = field(default_factory=dict)

    # the walk ---------------------------------------------------------------------------
    def write(self, tar: tarfile.TarFile) -> None:
        targets = {_rel(t): lowers for t, lowers in self.layers}
        if "" not in targets:
            raise ValueError("a template needs a layer for /")
        fds = _open_roots(targets[""])
        try:
            self._dir(tar, "", fds, targets)
        finally:
            for fd in fds:
                os.close(fd)

    def _dir(self, tar: tarfile.TarFile, rel: str, fds: list[int],
             targets: dict[str, list[str]]) -> None:
        extra = self._extra_below(rel)
        if rel in self.extra and self.extra[rel].replace:
            children: dict[str, list[tuple[int, os.stat_result]]] = {}
        else:
            children = _merge(fds)
        names = set(children) | {_child(rel, t) for t in targets if _under(t, rel)}
        names |= set(extra)
        for name in sorted(names):
            path = f"{rel}/{name}" if rel else name
            if path in targets:  # a mount: its own lowers, whatever the parent held there
                sub = _open_roots(targets[path])
                try:
                    self._emit_dir(tar, path, os.fstat(sub[0]) if sub else None)
                    self._dir(tar, path, sub, targets)
                finally:
                    for fd in sub:
                        os.close(fd)
                continue
            found = children.get(name)
            ex = self.extra.get(path)
            if ex is not None and (ex.data is not None or ex.replace or found is None
                                   or not stat.S_ISDIR(found[0][1].st_mode)):
                self._emit_extra(tar, path, ex)
                if ex.data is None:  # the template's entry (if any) is not a directory
                    self._dir(tar, path, [], targets)
                continue
            if found is None:  # a parent of a deeper mount or extra entry: made up
                self._emit_dir(tar, path, None)
                self._dir(tar, path, [], targets)
                continue
            fd, st = found[0]
            if stat.S_ISDIR(st.st_mode):
                self._emit_dir(tar, path, st)
                self._descend(tar, path, found, targets)
            else:
                self._emit_other(tar, path, name, fd, st)

    def _descend(self, tar: tarfile.TarFile, path: str,
                 found: list[tuple[int, os.stat_result]] | None,
                 targets: dict[str, list[str]]) -> None:
        name = posixpath.basename(path)
        sub: list[int] = []
        try:
            for parent, _st in found or []:
                sub.append(os.open(name, _DIR_FLAGS, dir_fd=parent))
            self._dir(tar, path, sub, targets)
        finally:
            for fd in sub:
                os.close(fd)

    def _extra_below(self, rel: str) -> set[str]:
        return {_child(rel, p) for p in self.extra if _under(p, rel)}

    # members ----------------------------------------------------------------------------
    def _info(self, path: str, st: os.stat_result | None, kind: bytes) -> tarfile.TarInfo:
        info = tarfile.TarInfo(path)
        info.type = kind
        if st is None:
            info.mode, info.mtime = 0o755, 0
            return info
        info.mode = stat.S_IMODE(st.st_mode)
        info.mtime = max(0, int(st.st_mtime))
        info.uid, info.gid = st.st_uid, st.st_gid
        if self.owner_as_root is not None:
            uid, gid = self.owner_as_root
            info.uid = 0 if info.uid == uid else info.uid
            info.gid = 0 if info.gid == gid else info.gid
        return info

    def _emit_dir(self, tar: tarfile.TarFile, path: str, st: os.stat_result | None) -> None:
        if path in self.index:
            return
        info = self._info(path, st, tarfile.DIRTYPE)
        tar.addfile(info)
        self._note(path, Entry("dir", info.mode))

    def _emit_extra(self, tar: tarfile.TarFile, path: str, ex: Extra) -> None:
        info = tarfile.TarInfo(path)
        info.mode = ex.mode
        if ex.data is None:
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
            self._note(path, Entry("dir", ex.mode))
            return
        info.size = len(ex.data)
        tar.addfile(info, io.BytesIO(ex.data))
        self.data_bytes += info.size
        self._note(path, Entry("file", ex.mode))

    def _emit_other(self, tar: tarfile.TarFile, path: str, name: str, parent: int,
                    st: os.stat_result) -> None:
        if stat.S_ISLNK(st.st_mode):
            info = self._info(path, st, tarfile.SYMTYPE)
            info.linkname = os.readlink(name, dir_fd=parent)
            tar.addfile(info)
            self._note(path, Entry("link", info.mode, info.linkname))
            return
        if stat.S_ISFIFO(st.st_mode):
            info = self._info(path, st, tarfile.FIFOTYPE)
            tar.addfile(info)
            self._note(path, Entry("fifo", info.mode))
            return
        if not stat.S_ISREG(st.st_mode):
            return  # sockets and device nodes: nothing an image carries
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in self._links:
            info = self._info(path, st, tarfile.LNKTYPE)
            info.linkname = self._links[key]
            tar.addfile(info)
            self._note(path, Entry("hardlink", info.mode, info.linkname))
            return
        fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
        with os.fdopen(fd, "rb") as fh:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode):  # replaced since it was listed
                return
            info = self._info(path, now, tarfile.REGTYPE)
            info.size = now.st_size
            tar.addfile(info, fh)  # exactly st_size bytes; a shrunken file is an error
        self.data_bytes += info.size
        if st.st_nlink > 1:
            self._links[key] = path
        self._note(path, Entry("file", info.mode))

    def _note(self, path: str, entry: Entry) -> None:
        self.index[path] = entry
        if self.progress is not None and len(self.index) % 500 == 0:
            self.progress(len(self.index), self.data_bytes)

    # checks -----------------------------------------------------------------------------
    def resolve(self, path: str) -> Entry | None:
        """What ``path`` names in the image, symlinks followed inside the image."""
        parts = [p for p in path.split("/") if p and p != "."]
        done: list[str] = []
        found = Entry("dir", 0o755)
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                if done:
                    done.pop()
                found = self.index.get("/".join(done)) if done else Entry("dir", 0o755)
                continue
            here = "/".join([*done, part])
            entry = self.index.get(here)
            if entry is None:
                return None
            if entry.kind == "hardlink":
                entry = self.index.get(entry.target)
                if entry is None:
                    return None
            if entry.kind == "link":
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    return None
                target = entry.target
                if target.startswith("/"):
                    done = []
                parts = [p for p in target.split("/") if p and p != "."] + parts
                continue
            if parts and entry.kind != "dir":
                return None
            done.append(part)
            found = entry
        return found


def _rel(target: str) -> str:
    norm = posixpath.normpath("/" + target.lstrip("/"))
    return norm.strip("/")


def _under(path: str, rel: str) -> bool:
    """``path`` is strictly below ``rel`` ("" is the root)."""
    return path != rel and (rel == "" or path.startswith(rel + "/")) and path != ""


def _child(rel: str, path: str) -> str:
    rest = path[len(rel) + 1:] if rel else path
    return rest.split("/", 1)[0]


def _open_roots(lowers: list[str]) -> list[int]:
    """The lowers' top directories (host paths the template names: trusted as given)."""
    fds: list[int] = []
    try:
        for lower in lowers:
            fds.append(os.open(lower, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _is_opaque(parent: int, name: str) -> bool:
    path = f"/proc/self/fd/{parent}/{name}"
    for attr in _OPAQUE_XATTRS:
        try:
            if os.getxattr(path, attr, follow_symlinks=False) in (b"y", b"y\0"):
                return True
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EPERM, errno.EACCES):
                raise
    return False


def _merge(fds: list[int]) -> dict[str, list[tuple[int, os.stat_result]]]:
    """The names of one merged directory: each with the (parent fd, lstat) of every lower
    that contributes to it, top first (several only for a merged directory)."""
    merged: dict[str, list[tuple[int, os.stat_result]]] = {}
    closed: set[str] = set()
    last = len(fds) - 1
    for i, fd in enumerate(fds):
        for name in _names(fd):
            if name in closed:
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            is_dir = stat.S_ISDIR(st.st_mode)
            if name in merged:  # an upper lower holds a directory of this name
                if is_dir:
                    merged[name].append((fd, st))
                if not is_dir or (i < last and _is_opaque(fd, name)):
                    closed.add(name)
                continue
            if _is_whiteout(st):
                closed.add(name)
                continue
            merged[name] = [(fd, st)]
            if not is_dir or (i < last and _is_opaque(fd, name)):
                closed.add(name)
    return merged


def _names(fd: int) -> Iterator[str]:
    # listdir(fd) lists the directory the fd holds, from its start each time.
    yield from os.listdir(fd)
