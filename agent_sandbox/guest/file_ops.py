"""The guest's file operations: read, write (atomic or append), list, stat, exists,
mkdir, remove, rename (stdlib only)."""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Dict, List, Optional

    Req = Dict[str, Any]

if __package__:
    from . import checks, users
    from . import protocol as proto
    from .conn import Conn
    from .errors import GuestError, bad, file_kind, os_error
    from .limits import LIST_CAP, LIST_JSON_CAP, STREAM_TIMEOUT
else:  # imported by agent.py from the guest's directory
    import checks  # type: ignore[no-redef]
    import protocol as proto  # type: ignore[no-redef]
    import users  # type: ignore[no-redef]
    from conn import Conn  # type: ignore[no-redef]
    from errors import GuestError, bad, file_kind, os_error  # type: ignore[no-redef]
    from limits import LIST_CAP, LIST_JSON_CAP, STREAM_TIMEOUT  # type: ignore[no-redef]


def op_read(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    offset = int(checks.integer(req, "offset", 0, 0, 1 << 62) or 0)
    limit = checks.integer(req, "limit", None, 0, 1 << 62)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise os_error(exc, path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise bad(f"{path}: is a {file_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        sent = _send_file(conn, fd, limit, path)
    finally:
        os.close(fd)
    conn.done(size=sent)


def _send_file(conn: Conn, fd: int, limit: Optional[int], path: str) -> int:
    sent = 0
    while limit is None or sent < limit:
        want = proto.CHUNK if limit is None else min(proto.CHUNK, limit - sent)
        try:
            data = os.read(fd, want)
        except OSError as exc:
            raise os_error(exc, path) from None
        if not data:
            break
        conn.send({"chunk": True}, data)
        sent += len(data)
    return sent


def _owner(req: Req) -> Optional[users.Account]:
    """Whom a new file or directory is for (``user``; None: root, as before)."""
    name = users.check_name(req.get("user"))
    return users.lookup(name) if name is not None else None


def _make_dirs(path: str, mode: int, owner: Optional[users.Account]) -> None:
    """``os.makedirs``, each directory it makes given to ``owner`` (what existed keeps
    its owner)."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            continue
        if owner is not None:
            os.lchown(directory, owner.uid, owner.gid)


def op_write(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    mode = int(checks.integer(req, "mode", 0o644, 0, 0o7777) or 0)
    append = bool(req.get("append"))
    owner = _owner(req)
    try:
        mode_now = os.stat(path).st_mode
    except OSError:
        mode_now = None
    if mode_now is not None and not stat.S_ISREG(mode_now):
        # Never a device node, FIFO or socket: writing /dev/zero is a mistake, not a file.
        raise bad(f"{path}: is a {file_kind(mode_now)}; files.write writes regular files")
    parent = os.path.dirname(path)
    try:
        _make_dirs(parent, 0o755, owner)
    except OSError as exc:
        raise os_error(exc, parent) from None
    size = (_write_append(conn, path, mode, owner) if append
            else _write_atomic(conn, path, mode, owner))
    conn.done(size=size)


def _receive_into(conn: Conn, fd: int, path: str) -> int:
    conn.send({"ready": True})
    conn.sock.settimeout(STREAM_TIMEOUT)
    size = 0
    while True:
        obj, payload = conn.recv("file data")
        view = memoryview(payload)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except OSError as exc:
                raise os_error(exc, path) from None
        size += len(payload)
        if obj.get("eof"):
            return size


def _write_append(conn: Conn, path: str, mode: int, owner: Optional[users.Account]) -> int:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
    try:
        created = False
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
            created = True
    except OSError as exc:
        raise os_error(exc, path) from None
    try:
        if created:
            os.fchmod(fd, mode)  # bypass the umask, like the atomic path does
            if owner is not None:
                os.fchown(fd, owner.uid, owner.gid)
        return _receive_into(conn, fd, path)
    finally:
        os.close(fd)


def _write_atomic(conn: Conn, path: str, mode: int, owner: Optional[users.Account]) -> int:
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.abx-{os.urandom(6).hex()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        # The directory exists (made above) but takes no new files: /proc, /sys.
        raise bad(f"{path}: its directory does not accept new files") from None
    except OSError as exc:
        raise os_error(exc, path) from None
    try:
        try:
            size = _receive_into(conn, fd, path)
            os.fchmod(fd, mode)
            _keep_owner(fd, path, owner)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise os_error(exc, path) from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return size


def _keep_owner(fd: int, path: str, owner: Optional[users.Account]) -> None:
    """Replacing a file must not silently hand it over to root; a new one is ``owner``'s."""
    try:
        st = os.lstat(path)
        os.fchown(fd, st.st_uid, st.st_gid)
    except FileNotFoundError:
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
    except OSError:
        pass


def op_list(conn: Conn, req: Req) -> None:
    root = checks.path(req)
    depth = int(checks.integer(req, "depth", 1, 1, 1 << 16) or 1)
    if not os.path.isdir(root):  # follows a symlink for the root only
        if not os.path.lexists(root):
            raise GuestError("not_found", f"{root}: no such file or directory")
        raise bad(f"{root}: not a directory")
    entries: List[Dict[str, Any]] = []
    stack = [(root, 1)]
    truncated = False
    size = 0
    while stack and not truncated:
        directory, level = stack.pop()
        try:
            with os.scandir(directory) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            if directory == root:
                raise os_error(exc, root) from None
            continue  # unreadable subdirectory: skip it
        subdirs = []
        for child in children:
            if len(entries) >= LIST_CAP or size >= LIST_JSON_CAP:
                truncated = True
                break
            try:
                entry = _entry(child.path, child.stat(follow_symlinks=False))
            except OSError:
                continue  # vanished while listing
            entries.append(entry)
            size += len(proto.encode_json(entry)) + 1
            if level < depth and child.is_dir(follow_symlinks=False):
                subdirs.append((child.path, level + 1))
        stack.extend(reversed(subdirs))
    conn.done(entries=entries, truncated=truncated)


def op_stat(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    try:
        conn.done(entry=_entry(path, os.lstat(path)))
    except OSError as exc:
        raise os_error(exc, path) from None


def op_exists(conn: Conn, req: Req) -> None:
    conn.done(exists=os.path.lexists(checks.path(req)))


def op_mkdir(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    mode = int(checks.integer(req, "mode", 0o755, 0, 0o7777) or 0)
    try:
        owner = _owner(req)
        if req.get("parents", True):
            if os.path.lexists(path) and not os.path.isdir(path):
                raise bad(f"{path}: exists and is not a directory")
            _make_dirs(path, mode, owner)
        else:
            os.mkdir(path, mode)
            if owner is not None:
                os.lchown(path, owner.uid, owner.gid)
    except OSError as exc:
        raise os_error(exc, path) from None
    conn.done()


def op_remove(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    if os.path.normpath(path).strip("/") == "" or os.path.realpath(path) == "/":
        raise bad("refusing to remove '/'")
    recursive = bool(req.get("recursive", True))
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            if recursive:
                import shutil

                shutil.rmtree(path)
            else:
                os.rmdir(path)
        else:
            os.unlink(path)
    except OSError as exc:
        raise os_error(exc, path) from None
    conn.done()


def op_rename(conn: Conn, req: Req) -> None:
    src, dst = checks.path(req, "src"), checks.path(req, "dst")
    try:
        os.rename(src, dst)
    except OSError as exc:
        raise os_error(exc, f"rename {src} -> {dst}") from None
    conn.done()


def _entry(path: str, st: os.stat_result) -> Dict[str, Any]:
    if stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    elif stat.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    entry = {
        "name": os.path.basename(path.rstrip("/")) or "/",
        "path": path,
        "type": kind,
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }
    if kind == "symlink":
        try:
            entry["target"] = os.readlink(path)
        except OSError:
            entry["target"] = None
    return entry


HANDLERS: Dict[str, Callable[[Conn, Req], None]] = {
    "read": op_read,
    "write": op_write,
    "list": op_list,
    "stat": op_stat,
    "exists": op_exists,
    "mkdir": op_mkdir,
    "remove": op_remove,
    "rename": op_rename,
}
