"""Can the engine work from this data dir? One check, run by the engine before it makes
anything (``HostMode.prepare``) and by ``abx doctor``, so the two never disagree. It tries
what creating a sandbox needs of the host's paths, and says which directory is in the way
and the fix:

- the data dir is there or can be made, and takes new directories: one is made and
  removed where the engine would make its own (a file in the way, a read-only mount,
  /proc, no permission all show here, not at the first create);
- the root engine only: the sandboxes' root (host uid and gid ``HOST_ID_BASE``) enters
  every directory above the data dir (runc, as that user, mounts each sandbox's files
  from below it: a 0700 directory on the way is runc's "error preparing rootfs ...
  permission denied"), and reads the guest agent's directory (bound into every sandbox).
  The rootless engine's sandboxes' root is the engine's own user: what it can make it
  can reach.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent_sandbox.config.engine import HOST_ID_BASE, HOST_ID_COUNT
from agent_sandbox.config.settings import builtin_data_dir
from agent_sandbox.core.errors import RuntimeUnavailableError
from agent_sandbox.guest import SOURCE_DIR

GUEST_DIR = SOURCE_DIR


@dataclass(frozen=True)
class PathProblem:
    """What is wrong (naming the directory in the way) and the exact fix."""

    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}. Fix: {self.fix}"


def data_dir_problem(data_dir: Path, sandbox_root: int | None) -> PathProblem | None:
    """None when sandboxes can be made from ``data_dir``; ``sandbox_root``: the host id
    of the sandboxes' root (uid and gid), None for the rootless engine."""
    data_dir = Path(os.path.abspath(data_dir))
    problem = _takes_directories(data_dir)
    if problem is None and sandbox_root is not None:
        problem = _reachable(data_dir, sandbox_root)
    return problem


def require_usable(data_dir: Path, sandbox_root: int | None) -> None:
    """The engine's start: RuntimeUnavailableError (what, and the fix) before anything is
    made, rather than runc's "permission denied" at the first create."""
    problem = data_dir_problem(data_dir, sandbox_root)
    if problem is not None:
        raise RuntimeUnavailableError(str(problem))


def make_dirs(path: Path) -> None:
    """``mkdir -p``, the directories made 0755 whatever the umask (a umask of 077 would
    make them 0700: closed to the sandboxes' root)."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o755)
        except FileExistsError:
            continue
        os.chmod(directory, 0o755)


def _elsewhere(data_dir: Path) -> str:
    default = builtin_data_dir()
    return ("choose another data dir (ABX_DATA_DIR)" if data_dir == default
            else f"choose another data dir (ABX_DATA_DIR={default}, the default)")


def _takes_directories(data_dir: Path) -> PathProblem | None:
    there = data_dir
    while not os.path.lexists(there):
        there = there.parent
    if not there.is_dir():
        return PathProblem(f"the data dir {data_dir} cannot be made: {there} is not a "
                           "directory", _elsewhere(data_dir))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".abx-probe-", dir=there))
    except OSError as exc:
        verb = "is not writable" if there == data_dir else "cannot be made"
        what = f"the data dir {data_dir} {verb}: {there} takes no new directory " \
               f"({exc.strerror or exc})"
        if exc.errno in (errno.EACCES, errno.EPERM) and os.geteuid() != 0:
            made = "" if there == data_dir else f"mkdir -p {data_dir} && "
            return PathProblem(what, f"as root: {made}chown {os.geteuid()} {data_dir}; or "
                               "choose a data dir of your own (ABX_DATA_DIR)")
        if exc.errno == errno.EROFS:
            return PathProblem(what, f"{_elsewhere(data_dir)}, on a writable file system")
        return PathProblem(what, _elsewhere(data_dir))
    return None


def mode_allows(st: os.stat_result, uid: int, gid: int, want: int) -> bool:
    """Whether ``uid``, with ``gid`` its only group, has ``want`` (a mix of 4, 2, 1) on
    it by its mode bits."""
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
    return (st.st_mode >> shift) & want == want


def first_closed(path: str, uid: int, gid: int, want: int) -> str:
    """The first directory above ``path`` that uid:gid cannot enter, else ``path`` itself
    if it lacks ``want`` there, by the mode bits ("" if none; a part that cannot be
    stat'ed counts as closed)."""
    target = Path(path).resolve()
    for part in (*reversed(target.parents), target):
        try:
            st = part.stat()
        except OSError:
            return str(part)
        if not mode_allows(st, uid, gid, want if part == target else os.X_OK):
            return str(part)
    return ""


def _may(st: os.stat_result, ident: int, want: int) -> bool:
    """Whether host id ``ident`` (uid and gid) has ``want`` (a mix of 4, 2, 1) on it."""
    mapped = range(HOST_ID_BASE, HOST_ID_BASE + HOST_ID_COUNT)
    if st.st_uid in mapped and st.st_gid in mapped:
        return True  # the sandboxes' own: their root's capabilities hold there
    return mode_allows(st, ident, ident, want)


def _has_acl(path: str) -> bool:
    try:
        os.getxattr(path, "system.posix_acl_access")
    except OSError:
        return False
    return True  # an ACL may grant what the mode bits do not: not judged here


def _blocked(path: str, ident: int, want: int) -> os.stat_result | None:
    st = os.stat(path)
    return None if _may(st, ident, want) or _has_acl(path) else st


def _ancestors(path: str) -> list[str]:
    """The existing directories above ``path``, from / down (symlinks resolved)."""
    real = Path(os.path.realpath(path))
    return [str(p) for p in reversed(real.parents) if p.is_dir()]


def _shown(path: str, st: os.stat_result) -> str:
    return f"{path} ({stat.filemode(st.st_mode)}, owner {st.st_uid}:{st.st_gid})"


def _bit(st: os.stat_result, ident: int, letters: str) -> str:
    who = "u" if st.st_uid == ident else "g" if st.st_gid == ident else "o"
    return f"{who}+{letters}"


def _reachable(data_dir: Path, ident: int) -> PathProblem | None:
    for directory in _ancestors(str(data_dir)):
        st = _blocked(directory, ident, 1)
        if st is not None:
            return PathProblem(
                f"the sandboxes' root (host uid {ident}) cannot enter {_shown(directory, st)},"
                f" above the data dir {data_dir}: runc could not mount any sandbox's files "
                "(\"error preparing rootfs: ... permission denied\")",
                f"chmod {_bit(st, ident, 'x')} {directory}; or {_elsewhere(data_dir)}")
    return _guest_readable(ident)


def _guest_readable(ident: int) -> PathProblem | None:
    """The guest agent's code, bound into every sandbox and run by its root."""
    guest = os.path.realpath(GUEST_DIR)
    fix_tree = f"chmod -R o+rX {guest}"
    for directory in _ancestors(guest):
        st = _blocked(directory, ident, 1)
        if st is not None:
            return PathProblem(
                f"the sandboxes' root (host uid {ident}) cannot enter {_shown(directory, st)},"
                f" above the guest agent's code {guest} that every sandbox runs",
                f"chmod {_bit(st, ident, 'x')} {directory}; or install agent-sandbox "
                "outside it (pip install . from a checkout others can read)")
    paths = [guest] + [os.path.join(guest, n) for n in sorted(os.listdir(guest))
                       if n.endswith(".py")]
    for path in paths:
        st = _blocked(path, ident, 5 if path == guest else 4)
        if st is not None:
            return PathProblem(f"the sandboxes' root (host uid {ident}) cannot read "
                               f"{_shown(path, st)}, the guest agent every sandbox runs",
                               fix_tree)
    return None
