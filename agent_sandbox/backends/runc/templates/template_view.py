"""A template's merged view, read from the host: which layer holds a path, what the
topmost lower has there, its accounts. Lowers hold what sandboxes wrote (a RUN's layer):
every lookup goes through descriptors (``openat2`` beneath the lower, no link followed)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from agent_sandbox.backends.runc.rootfs.confined import UnsafePathError, openat2
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.templates import Layer

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PASSWD_MAX = 1 << 20


def target_dirname(target: str) -> str:
    return "_" + target.strip("/").replace("/", "+")


def target_of(layers: list[Layer], path: str) -> tuple[Layer, str]:
    """The template layer holding ``path`` (the deepest target above it) and the path
    relative to that target."""
    best = max((x for x in layers if x.target == "/" or path == x.target
                or path.startswith(x.target.rstrip("/") + "/")),
               key=lambda x: len(x.target), default=None)
    if best is None:
        raise InvalidArgumentError(f"{path} is in no layer of the template")
    return best, path[len(best.target.rstrip("/")):].strip("/")


def _lowers(layers: list[Layer], path: str) -> Iterator[tuple[int, str]]:
    """(a descriptor of each lower of ``path``'s layer, top first, that opens; ``path``
    relative to it); each closed once the caller moves on."""
    layer, rel = target_of(layers, path)
    for lower in layer.lowers:
        try:
            top = os.open(lower, _DIR)
        except OSError:
            continue
        try:
            yield top, rel
        finally:
            os.close(top)


def lookup(layers: list[Layer], path: str) -> os.stat_result | None:
    """``path``'s entry in the template's merged view (top lower first), not following
    links; None where no lower has it (or a whiteout hides it)."""
    for top, rel in _lowers(layers, path):
        if rel in ("", "."):
            return os.fstat(top)
        try:
            parent = openat2(top, os.path.dirname(rel) or ".", _DIR)
        except (FileNotFoundError, NotADirectoryError, UnsafePathError):
            continue
        try:
            st = os.stat(os.path.basename(rel), dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            continue
        finally:
            os.close(parent)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
            return None  # a whiteout
        return st
    return None


def read(layers: list[Layer], path: str) -> bytes:
    """A small regular file of the merged view (at most 1 MiB; b"" if it is none)."""
    st = lookup(layers, path)
    if st is None or not stat.S_ISREG(st.st_mode):
        return b""
    for top, rel in _lowers(layers, path):
        try:
            fd = openat2(top, rel, os.O_RDONLY | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError, UnsafePathError):
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return b""
            return os.read(fd, _PASSWD_MAX)
        finally:
            os.close(fd)
    return b""


def _same_meta(path: str, st: os.stat_result) -> None:
    os.chown(path, st.st_uid, st.st_gid)
    os.chmod(path, stat.S_IMODE(st.st_mode))


def make_dirs(staging: Path, layers: list[Layer], path: str, *, last: bool) -> int:
    """A descriptor of ``path``'s parent (``last``: of ``path`` itself) in the new
    layer, its missing directories made with the template's own owner and mode (an
    overlay takes a directory's attributes from its top layer)."""
    if path.rstrip("/") == "/workspace" or path.startswith("/workspace/"):
        raise InvalidArgumentError(f"{path}: /workspace is each sandbox's own volume, not "
                                   "part of a template; copy to another directory")
    layer, rel = target_of(layers, path.rstrip("/") or "/")
    top = staging / target_dirname(layer.target)
    if not top.is_dir():
        top.mkdir()
        meta = lookup(layers, layer.target)
        if meta is not None:
            _same_meta(str(top), meta)
    fd = os.open(top, _DIR)
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not last:
        parts = parts[:-1]
    done = layer.target.rstrip("/")
    try:
        for part in parts:
            done = f"{done}/{part}"
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                meta = lookup(layers, done)
                if meta is not None and not stat.S_ISDIR(meta.st_mode):
                    raise InvalidArgumentError(
                        f"{done} is not a directory in the template (a COPY or WORKDIR "
                        "cannot pass through it)")
                if meta is not None:
                    os.chown(part, meta.st_uid, meta.st_gid, dir_fd=fd)
                    os.chmod(part, stat.S_IMODE(meta.st_mode), dir_fd=fd)
            except FileExistsError:
                pass
            nxt = openat2(fd, part, _DIR)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def owner(layers: list[Layer], spec: str) -> tuple[int, int]:
    """``--chown=USER[:GROUP]``: numbers, or names from the template's /etc/passwd and
    /etc/group (read confined: a RUN may have written them)."""
    user, _, group = spec.partition(":")
    uid = _id(user, _table(layers, "/etc/passwd"), "user")
    gid = _id(group, _table(layers, "/etc/group"), "group") if group else \
        _primary_gid(layers, user, uid)
    return uid, gid

def _primary_gid(layers: list[Layer], user: str, uid: int) -> int:
    for row in _table(layers, "/etc/passwd"):
        if row[0] == user or (len(row) > 3 and row[2] == str(uid)):
            return int(row[3]) if row[3].isdigit() else uid
    return uid

def _table(layers: list[Layer], path: str) -> list[list[str]]:
    data = read(layers, path)
    return [line.split(":") for line in data.decode(errors="replace").splitlines()
            if line.count(":") >= 2]


def _id(name: str, table: list[list[str]], what: str) -> int:
    if name.isdigit():
        return int(name)
    for row in table:
        if row[0] == name and row[2].isdigit():
            return int(row[2])
    raise InvalidArgumentError(f"--chown: no {what} {name!r} in the template (give a "
                               "number, or add the account in an earlier RUN)")
