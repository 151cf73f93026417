"""The guest's file operations: read, write (atomic or append), list, stat, exists,
mkdir, remove, rename (stdlib only)."""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Dict, List, Optional, Tuple

    Req = Dict[str, Any]

if __package__:
    from . import checks, locks, ops, owners, users
    from . import protocol as proto
    from .conn import Conn
    from .errors import GuestError, bad, file_kind, os_error
    from .limits import (
        LIST_CAP,
        LIST_JSON_CAP,
        MAX_FILE_METADATA,
        MAX_FILE_OFFSET,
        STREAM_TIMEOUT,
    )
else:  # imported by agent.py from the guest's directory
    import checks  # type: ignore[no-redef]
    import locks  # type: ignore[no-redef]
    import ops  # type: ignore[no-redef]
    import owners  # type: ignore[no-redef]
    import protocol as proto  # type: ignore[no-redef]
    import users  # type: ignore[no-redef]
    from conn import Conn  # type: ignore[no-redef]
    from errors import GuestError, bad, file_kind, os_error  # type: ignore[no-redef]
    from limits import (  # type: ignore[no-redef]
        LIST_CAP,
        LIST_JSON_CAP,
        MAX_FILE_METADATA,
        MAX_FILE_OFFSET,
        STREAM_TIMEOUT,
    )

# A file's metadata: xattrs named user.e2b.<key> (E2B's envd), keys HTTP header tokens.
META_PREFIX = "user.e2b."
_META_KEY = frozenset("abcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~")
_UNSUPPORTED = (errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA)


def op_read(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    offset = int(checks.integer(req, "offset", 0, 0, MAX_FILE_OFFSET) or 0)
    limit = checks.integer(req, "limit", None, 0, MAX_FILE_OFFSET)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise os_error(exc, path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise bad(f"{path}: is a {file_kind(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        conn.send({"version": locks.version_of(st)})  # what a conditional write names
        sent = _send_file(conn, fd, limit, path) if _seek(fd, offset, path) else 0
    finally:
        os.close(fd)
    conn.done(size=sent)


def _seek(fd: int, offset: int, path: str) -> bool:
    """Move to ``offset``; False when it is past the largest file this filesystem can hold
    (lseek says EINVAL there): past the end, so nothing to read, as past any file's end."""
    if not offset:
        return True
    try:
        os.lseek(fd, offset, os.SEEK_SET)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOVERFLOW):
            return False
        raise os_error(exc, path) from None
    return True


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


def owner_of(req: Req) -> Optional[users.Account]:
    """Whom a new file or directory is for (``user``; None: root, as before)."""
    name = users.check_name(req.get("user"))
    return users.lookup(name) if name is not None else None


def make_dirs(path: str, mode: int, owner: Optional[users.Account]) -> None:
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
            owners.give_dir(directory, (owner.uid, owner.gid))


def op_write(conn: Conn, req: Req) -> None:
    """Write a file: the path's turn taken first (``locks``: one write of ours at a time,
    none past another holder's lock; at most ``lock_wait`` s waited), then ``if_match``
    checked, then the data received."""
    path = checks.path(req)
    mode = int(checks.integer(req, "mode", 0o644, 0, 0o7777) or 0)
    append = bool(req.get("append"))
    owner = owner_of(req)
    metadata = _metadata_of(req)
    wait, token = locks.Locks.wait_of(req), locks.Locks.token_of(req)
    with locks.TABLE.write(path, wait, token):
        locks.check_match(req, path)
        size, version = _write(conn, req, path, mode, append, owner, metadata)
    conn.done(size=size, version=version)


def _metadata_of(req: Req) -> Optional[Dict[str, str]]:
    """The write's metadata (checked by the host; held to the same rules here)."""
    given = req.get("metadata")
    if given is None:
        return None
    if not isinstance(given, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and _good_meta(k, v)
            for k, v in given.items()):
        raise bad("metadata must map header-token keys to printable ASCII values")
    if sum(len(META_PREFIX) + len(k) + len(v) for k, v in given.items()) > MAX_FILE_METADATA:
        raise bad(f"metadata is over {MAX_FILE_METADATA} bytes")
    return given


def _good_meta(key: str, value: str) -> bool:
    return bool(key) and all(c in _META_KEY for c in key) and all(
        " " <= c <= "~" for c in value)


def set_metadata(fd: int, path: str, metadata: Optional[Dict[str, str]]) -> None:
    """Replace the file's metadata with ``metadata`` (None: none); a filesystem without
    user xattrs keeps none, as envd does."""
    try:
        for name in os.listxattr(fd):
            if name.startswith(META_PREFIX) and name[len(META_PREFIX):] not in (metadata or {}):
                os.removexattr(fd, name)
        for key, value in (metadata or {}).items():
            os.setxattr(fd, META_PREFIX + key, value.encode())
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return
        raise os_error(exc, path) from None


def get_metadata(path: str) -> Optional[Dict[str, str]]:
    """The file's metadata (following a symlink, as envd), None when it has none. Only
    what a write could have set is reported, within MAX_FILE_METADATA bytes: a process in
    the sandbox may set any xattr itself."""
    try:
        names = os.listxattr(path)
    except OSError:
        return None
    found: Dict[str, str] = {}
    size = 0
    for name in sorted(n for n in names if n.startswith(META_PREFIX)):
        try:
            value = os.getxattr(path, name).decode("ascii")
        except (OSError, UnicodeDecodeError):
            continue
        key = name[len(META_PREFIX):]
        size += len(name) + len(value)
        if size > MAX_FILE_METADATA:
            break
        if _good_meta(key, value):
            found[key] = value
    return found or None


def _write(conn: Conn, req: Req, path: str, mode: int, append: bool,
           owner: Optional[users.Account], metadata: Optional[Dict[str, str]]
           ) -> Tuple[int, Optional[str]]:
    try:
        mode_now = os.stat(path).st_mode
    except OSError:
        mode_now = None
    if mode_now is not None and not stat.S_ISREG(mode_now):
        # Never a device node, FIFO or socket: writing /dev/zero is a mistake, not a file.
        raise bad(f"{path}: is a {file_kind(mode_now)}; files.write writes regular files")
    parent = os.path.dirname(path)
    try:
        make_dirs(parent, 0o755, owner)
    except OSError as exc:
        raise os_error(exc, parent) from None
    if append:
        size = _write_append(conn, path, mode, owner, req.get("metadata") is not None,
                             metadata)
        return size, locks.current_version(path)
    return _write_atomic(conn, req, path, mode, owner, metadata, new=mode_now is None)


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


def _write_append(conn: Conn, path: str, mode: int, owner: Optional[users.Account],
                  set_meta: bool, metadata: Optional[Dict[str, str]]) -> int:
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
        if set_meta:
            set_metadata(fd, path, metadata)
        return _receive_into(conn, fd, path)
    finally:
        os.close(fd)


def _write_atomic(conn: Conn, req: Req, path: str, mode: int,
                  owner: Optional[users.Account], metadata: Optional[Dict[str, str]],
                  new: bool) -> Tuple[int, str]:
    directory, name = os.path.split(path)
    # '.abx_' when the file is new, '.abx-' when it replaces one: what a watcher reports
    # of the final rename (surfaces/e2b/envd/watchers.py) differs, as envd's events do.
    tmp = os.path.join(directory, f".{name}.abx{'_' if new else '-'}{os.urandom(6).hex()}")
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
            # The new file has none: what is given is all it has (a rewrite clears the
            # old file's, as envd's does).
            set_metadata(fd, path, metadata)
            # Checked again as late as can be: a process in the sandbox may have written.
            locks.check_match(req, path)
            try:
                old: Optional[os.stat_result] = os.lstat(path)
            except OSError:
                old = None
            locks.bump_mtime(fd, old)
            version = locks.version_of(os.fstat(fd))
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
    return size, version


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
    users.ensure_default_home(root)
    depth = int(checks.integer(req, "depth", 1, 1, 1 << 16) or 1)
    if not os.path.isdir(root):  # follows a symlink for the root only
        if not os.path.lexists(root):
            raise GuestError("not_found", f"{root}: no such file or directory")
        raise bad(f"{root}: not a directory")
    entries: List[Dict[str, Any]] = []
    names: Dict[Any, Any] = {}
    # Depth-first, each directory's entries by name, a directory's contents right after
    # it (as envd's filepath.WalkDir lists them).
    stack = [(iter(_children(root, root)), 1)]
    truncated = False
    size = 0
    while stack:
        children, level = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            continue
        if len(entries) >= LIST_CAP or size >= LIST_JSON_CAP:
            truncated = True
            break
        try:
            entry = _entry(child.path, child.stat(follow_symlinks=False), names)
        except OSError:
            continue  # vanished while listing
        entries.append(entry)
        size += len(proto.encode_json(entry)) + 1
        if level < depth and child.is_dir(follow_symlinks=False):
            stack.append((iter(_children(child.path, root)), level + 1))
    conn.done(entries=entries, truncated=truncated)


def _children(directory: str, root: str) -> List[Any]:
    """A directory's entries by name; an unreadable one is skipped (the root: an error)."""
    try:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as exc:
        if directory == root:
            raise os_error(exc, root) from None
        return []


def op_stat(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    users.ensure_default_home(path)
    try:
        conn.done(entry=_entry(path, os.lstat(path)))
    except OSError as exc:
        raise os_error(exc, path) from None


def op_exists(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    users.ensure_default_home(path)
    conn.done(exists=os.path.lexists(path))


def op_mkdir(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    mode = int(checks.integer(req, "mode", 0o755, 0, 0o7777) or 0)
    try:
        owner = owner_of(req)
        if req.get("parents", True):
            if os.path.lexists(path) and not os.path.isdir(path):
                raise bad(f"{path}: exists and is not a directory")
            make_dirs(path, mode, owner)
        else:
            os.mkdir(path, mode)
            if owner is not None:
                owners.give_dir(path, (owner.uid, owner.gid))
    except OSError as exc:
        raise os_error(exc, path) from None
    conn.done()


def op_remove(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    if os.path.normpath(path).strip("/") == "" or os.path.realpath(path) == "/":
        raise bad("refusing to remove '/'")
    recursive = bool(req.get("recursive", True))
    locks.TABLE.check(path, locks.Locks.token_of(req))
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
    for one in (src, dst):
        locks.TABLE.check(one, locks.Locks.token_of(req))
    try:
        os.rename(src, dst)
    except OSError as exc:
        raise os_error(exc, f"rename {src} -> {dst}") from None
    conn.done()


def _name_of(kind: str, ident: int, names: Dict[Any, Any]) -> str:
    """The user or group name of an id in this sandbox's own /etc/passwd or /etc/group
    (the id itself when it has none), read once per operation."""
    if kind not in names:
        try:
            names[kind] = users.names_by_id(kind)
        except GuestError:  # unreadable or oversized: ids are shown instead
            names[kind] = {}
    return names[kind].get(ident) or str(ident)


def _entry(path: str, st: os.stat_result, names: Optional[Dict[Any, Any]] = None
           ) -> Dict[str, Any]:
    names = {} if names is None else names
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
        "owner": _name_of("user", st.st_uid, names),
        "group": _name_of("group", st.st_gid, names),
    }
    if kind == "file":
        entry["version"] = locks.version_of(st)
    if kind == "symlink":
        try:
            entry["target"] = os.readlink(path)
        except OSError:
            entry["target"] = None
        _resolve(path, entry)
    metadata = get_metadata(path) if kind != "other" else None
    if metadata:
        entry["metadata"] = metadata
    return entry


def _resolve(path: str, entry: Dict[str, Any]) -> None:
    """What a symlink finally points at (a chain followed, as envd's EvalSymlinks): its
    absolute path and type; neither when it dangles or loops."""
    resolved = os.path.realpath(path)
    try:
        st = os.stat(resolved)
    except OSError:
        return
    entry["resolved"] = resolved
    entry["target_type"] = ("dir" if stat.S_ISDIR(st.st_mode) else
                            "file" if stat.S_ISREG(st.st_mode) else "other")


HANDLERS: Dict[str, Callable[[Conn, Req], None]] = {
    ops.READ: op_read,
    ops.WRITE: op_write,
    ops.LIST: op_list,
    ops.STAT: op_stat,
    ops.EXISTS: op_exists,
    ops.MKDIR: op_mkdir,
    ops.REMOVE: op_remove,
    ops.RENAME: op_rename,
}
