"""Applies image layers onto a template rootfs, trusting nothing in them: members that
would write outside the rootfs are refused, whiteouts only ever hide what lower layers
made, and symlinks are only ever followed as if the rootfs were ``/`` (never onto the
host)."""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
from pathlib import Path

from agent_sandbox.core.errors import InvalidArgumentError

COPY_CHUNK = 1 << 20
MAX_LINK_HOPS = 40
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"


# ---- paths inside the rootfs -----------------------------------------------------------
def resolve_in_root(root: Path, rel: str, *, follow_last: bool = True) -> Path:
    """``rel`` resolved as if ``root`` were ``/``: symlinks, absolute or full of ``..``,
    are followed but can never lead out of ``root``. The result has no symlink in it
    (except, with ``follow_last=False``, its last component)."""
    todo = [p for p in rel.split("/") if p not in ("", ".")]
    done: list[str] = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = root.joinpath(*done, part)
        if (todo or follow_last) and candidate.is_symlink():
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise InvalidArgumentError(f"too many levels of symlinks resolving {rel!r}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p not in ("", ".")] + todo
            continue
        done.append(part)
    return root.joinpath(*done)


def member_path(name: str) -> str:
    """A tar member name as a clean relative path ("" for the root); hostile ones refused."""
    if name.startswith("/"):
        raise InvalidArgumentError(f"refusing archive member with an absolute path: {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidArgumentError(f"refusing archive member with '..' in its path: {name!r}")
    return "/".join(parts)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


# ---- one layer -------------------------------------------------------------------------
def apply_layer(layer: tarfile.TarFile, root: Path) -> None:
    """Apply one layer on ``root``: its whiteouts first (they only ever hide what lower
    layers made), then its content, in archive order."""
    members = [(m, member_path(m.name)) for m in layer.getmembers()]
    for _, rel in members:
        if posixpath.basename(rel).startswith(_WHITEOUT):
            _apply_whiteout(root, rel)
    dirs: list[tuple[tarfile.TarInfo, Path]] = []
    for member, rel in members:
        if posixpath.basename(rel).startswith(_WHITEOUT):
            continue
        target = _extract(layer, member, rel, root)
        if target is not None and member.isdir():
            dirs.append((member, target))
    # Directory times last: creating their children changed them.
    for member, target in reversed(dirs):
        os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)


def _apply_whiteout(root: Path, rel: str) -> None:
    parent = resolve_in_root(root, posixpath.dirname(rel))
    name = posixpath.basename(rel)
    if name == _OPAQUE:
        if parent.is_dir():
            for child in parent.iterdir():
                _remove(child)
    elif not name.startswith(_WHITEOUT * 2):  # .wh..wh.* other than opq: aufs bookkeeping
        hidden = name[len(_WHITEOUT):]
        if hidden not in ("", ".", ".."):
            _remove(parent / hidden)


def _extract(layer: tarfile.TarFile, member: tarfile.TarInfo, rel: str,
             root: Path) -> Path | None:
    if rel == "":
        if member.isdir():
            _set_meta(root, member)
            return root
        raise InvalidArgumentError(f"refusing archive member {member.name!r}: the root "
                                   "must be a directory")
    if (member.ischr() or member.isblk()) and not (
            member.ischr() and member.devmajor == 0 and member.devminor == 0):
        return None  # real device nodes are never needed in a rootfs (/dev is a tmpfs)
    parent = resolve_in_root(root, posixpath.dirname(rel))
    parent.mkdir(parents=True, exist_ok=True)  # no symlink left in it: safe
    target = parent / posixpath.basename(rel)
    if member.isdir():
        if not (target.is_dir() and not target.is_symlink()):
            _remove(target)
            target.mkdir()
        _set_meta(target, member)
        return target
    _remove(target)
    if member.isreg():
        _write_file(layer, member, target)
    elif member.issym():
        os.symlink(member.linkname, target)  # only ever read inside the sandbox
    elif member.islnk():
        _hardlink(root, member, target)
        return target  # shares its source's metadata
    elif member.isfifo():
        os.mkfifo(target)
    elif member.ischr():
        os.mknod(target, stat.S_IFCHR, os.makedev(0, 0))  # an overlay whiteout: inert
    else:
        return None
    _set_meta(target, member)
    return target


def _write_file(layer: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    src = layer.extractfile(member)
    if src is None:
        raise InvalidArgumentError(f"archive member {member.name!r} has no data")
    with src, os.fdopen(os.open(target, flags, 0o600), "wb") as out:
        shutil.copyfileobj(src, out, COPY_CHUNK)


def _hardlink(root: Path, member: tarfile.TarInfo, target: Path) -> None:
    source = resolve_in_root(root, member_path(member.linkname), follow_last=False)
    if not os.path.lexists(source) or (source.is_dir() and not source.is_symlink()):
        raise InvalidArgumentError(f"refusing hard link {member.name!r}: its target "
                                   f"{member.linkname!r} is not a file in the image")
    os.link(source, target, follow_symlinks=False)


def _set_meta(path: Path, member: tarfile.TarInfo) -> None:
    if _AS_ROOT:  # a plain user's import is all its own (root inside its sandboxes)
        os.chown(path, member.uid, member.gid, follow_symlinks=False)
    if not member.issym():
        os.chmod(path, member.mode & 0o7777)  # after chown, which clears setuid bits
    os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)


_AS_ROOT = os.geteuid() == 0
