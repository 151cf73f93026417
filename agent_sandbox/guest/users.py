"""Accounts inside the sandbox: who a command (or a terminal, or a kernel) runs as
(stdlib only).

``lookup(name)`` reads the sandbox's /etc/passwd and /etc/group itself, bounded, never
through NSS: the libc's NSS modules would be loaded from the sandbox's /lib into the
guest, which a sandbox process could have replaced. The default account ``user`` (uid
1000) is made on first use where a template lacks it: its passwd/group lines, a home it
owns, and /workspace made its own. ``popen_kwargs`` switches a ``subprocess.Popen``
child, ``become`` a forked one (a PTY); ``login_env`` sets HOME, USER and LOGNAME.
"""

from __future__ import annotations

import os
import re
import stat
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Dict, List, Optional, Tuple

if __package__:
    from .errors import GuestError, bad
else:  # imported by agent.py from the guest's directory
    from errors import GuestError, bad  # type: ignore[no-redef]

DEFAULT_USER = "user"
DEFAULT_UID = 1000
# Where things are (tests point them elsewhere).
WORKSPACE = "/workspace"
HOMES = "/home"
PASSWD, GROUP, SHADOW = "/etc/passwd", "/etc/group", "/etc/shadow"
UID_MAP, GID_MAP = "/proc/self/uid_map", "/proc/self/gid_map"
USER_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"  # runtime.validate's, kept equal by a test
_MAX_DB = 4 << 20  # /etc/passwd or /etc/group bigger than this is not read
_lock = threading.Lock()
_ready: Dict[str, Tuple[int, int]] = {}  # name -> (uid, mtime_ns of /etc/passwd) once set up


class Account:
    __slots__ = ("name", "uid", "gid", "groups", "home", "shell")

    def __init__(self, name: str, uid: int, gid: int, groups: List[int], home: str,
                 shell: str) -> None:
        self.name, self.uid, self.gid = name, uid, gid
        self.groups, self.home, self.shell = groups, home, shell


def check_name(value: Any) -> Optional[str]:
    """The ``user`` field of a request: None (root, as before), or an account name."""
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(USER_NAME_PATTERN, value):
        raise bad("'user' must be an account name such as 'user' or 'root' (letters, "
                  f"digits, '_', '.', '-'; at most 32), got {value!r}")
    return value


def _read(path: str) -> List[List[str]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise GuestError("internal", f"cannot read {path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GuestError("internal", f"{path} is not a regular file")
        data = os.read(fd, _MAX_DB + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_DB:
        raise GuestError("resource_exhausted", f"{path} is larger than {_MAX_DB} bytes")
    return [line.split(":") for line in data.decode("utf-8", "replace").splitlines()
            if line and not line.startswith("#")]


def names_by_id(kind: str) -> Dict[int, str]:
    """Ids to names from this sandbox's own /etc/passwd (``user``) or /etc/group, read as
    a file (no NSS module is loaded); the first name of an id wins."""
    found: Dict[int, str] = {}
    for row in _read(PASSWD if kind == "user" else GROUP):
        ident = _number(row[2]) if len(row) > 2 else None
        if ident is not None and row[0]:
            found.setdefault(ident, row[0][:64])
    return found


def _number(text: str) -> Optional[int]:
    return int(text) if text.isdigit() and len(text) < 11 else None


def _find(name: str) -> Optional[Account]:
    for fields in _read(PASSWD):
        if len(fields) >= 7 and fields[0] == name:
            uid, gid = _number(fields[2]), _number(fields[3])
            if uid is None or gid is None:
                raise GuestError("internal", f"{PASSWD} has a malformed entry for {name!r}")
            groups = sorted({gid} | _member_of(name))
            return Account(name, uid, gid, groups, fields[5] or "/", fields[6] or "/bin/sh")
    return None


def _member_of(name: str) -> set:
    found = set()
    for fields in _read(GROUP):
        gid = _number(fields[2]) if len(fields) >= 4 else None
        if gid is not None and name in fields[3].split(","):
            found.add(gid)
    return found


def _mapped(uid: int, path: str) -> bool:
    try:
        with open(path) as fh:
            rows = [line.split() for line in fh.read(65536).splitlines()]
    except OSError:
        return True  # no user namespace to ask: let setuid decide
    try:
        return any(len(r) == 3 and int(r[0]) <= uid < int(r[0]) + int(r[2]) for r in rows)
    except ValueError:
        return True


def lookup(name: str) -> Account:
    """The account ``name`` (the default account is made if missing); an unknown name or
    an id this sandbox cannot use is a clear error."""
    if name == DEFAULT_USER:
        _ensure_default()
    account = _find(name)
    if account is None and name == "root":  # a minimal root without /etc/passwd
        account = Account("root", 0, 0, [0], "/root", "/bin/sh")
    if account is None:
        raise GuestError("not_found", f"no user {name!r} in the sandbox's {PASSWD} (add "
                                      f"it with useradd, or use {DEFAULT_USER!r} or 'root')")
    for ident, kind in ((account.uid, "uid"), (account.gid, "gid")):
        if not _mapped(ident, UID_MAP if kind == "uid" else GID_MAP):
            raise GuestError("wrong_state", f"{kind} {ident} of user {name!r} is not mapped "
                             "in this sandbox: its engine gives it only root (rootless "
                             "without /etc/subuid and /etc/subgid ranges for the engine's "
                             "user; `abx doctor` shows them); run as root instead")
    return account


def ensure_default_home(path: str) -> None:
    """The default user (and so its home) made before ``path`` is looked at when it is in
    that home: /home/user always exists in E2B's sandboxes, here it is made on first use."""
    home = f"{HOMES}/{DEFAULT_USER}"
    if path == home or path.startswith(home + "/"):
        try:
            _ensure_default()
        except GuestError:  # no account can be made: the path is as it is
            pass


def _ensure_default() -> None:
    try:
        stamp = os.stat(PASSWD).st_mtime_ns
    except OSError:
        stamp = 0
    with _lock:
        if _ready.get(DEFAULT_USER, (None, None))[1] == stamp:
            return
        account = _find(DEFAULT_USER)
        if account is None:
            account = _add_default()
        if _mapped(account.uid, UID_MAP) and _mapped(account.gid, GID_MAP):
            if account.home == f"{HOMES}/{DEFAULT_USER}":  # never an image's other home
                _own(account.home, account, create=True)
            _own(WORKSPACE, account, create=False, only_from_root=True)
        try:
            stamp = os.stat(PASSWD).st_mtime_ns
        except OSError:
            pass
        _ready[DEFAULT_USER] = (account.uid, stamp)


def _add_default() -> Account:
    uid = gid = DEFAULT_UID
    home = f"{HOMES}/{DEFAULT_USER}"
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    groups = _read(GROUP)
    lines = [(PASSWD, f"{DEFAULT_USER}:x:{uid}:{gid}::{home}:{shell}\n")]
    if not any(len(f) >= 3 and f[2] == str(gid) for f in groups):
        lines.append((GROUP, f"{DEFAULT_USER}:x:{gid}:\n"))
    if os.path.isfile(SHADOW):
        lines.append((SHADOW, f"{DEFAULT_USER}:!::0:99999:7:::\n"))
    for path, line in lines:
        try:
            _append(path, line)
        except OSError as exc:
            raise GuestError("internal", f"cannot add user {DEFAULT_USER!r} to {path}: "
                             f"{exc.strerror}") from None
    return Account(DEFAULT_USER, uid, gid, [gid], home, shell)


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                 | os.O_CLOEXEC, 0o644)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(22, "not a regular file")
        if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
            line = "\n" + line
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _own(path: str, account: Account, *, create: bool, only_from_root: bool = False) -> None:
    """Give ``path`` (not what is in it) to the account: made 0755 if missing and
    ``create``; with ``only_from_root``, only while it is still root's."""
    try:
        if create and not os.path.lexists(path):
            os.makedirs(path, mode=0o755, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode) or (only_from_root and st.st_uid != 0):
        return
    if (st.st_uid, st.st_gid) != (account.uid, account.gid):
        try:
            os.lchown(path, account.uid, account.gid)
        except OSError:
            pass  # a read-only mount: the account still runs, without that directory


def popen_kwargs(account: Optional[Account]) -> Dict[str, Any]:
    """What ``subprocess.Popen`` needs to start a child as ``account`` (done in C after the
    fork, so it is safe in a threaded process)."""
    if account is None:
        return {}
    return {"user": account.uid, "group": account.gid, "extra_groups": account.groups}


def become(account: Account) -> None:
    """Switch the calling process (a forked child) to ``account``: groups, gid, uid."""
    os.setgroups(account.groups)
    os.setgid(account.gid)
    os.setuid(account.uid)


def login_env(env: Dict[str, str], account: Optional[Account]) -> Dict[str, str]:
    """``env`` with HOME, USER and LOGNAME of ``account`` (unchanged for None)."""
    if account is None:
        return env
    return dict(env, HOME=account.home, USER=account.name, LOGNAME=account.name)
