"""Root mode: a small host-only tmpfs holding what every sandbox binds read-only from the
host — the guest agent's code, an empty file (over /etc/ld.so.preload) and resolv.conf.

A bind mount's root field in the sandbox's /proc/self/mountinfo is the source's path
within its own filesystem: bound from the host's disk, that named the checkout (or the
installed package) and the engine's data dir. From this tmpfs it is ``/guest-<digest>``,
``/empty`` and ``/resolv.conf``, the same on every host. The stage is mounted once per
boot, under the template views' lock, and released with them once no sandbox exists; the
guest's code is copied once per content (its bytecode with it, still valid: the copies
keep their sources' times).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from agent_sandbox.backends.runc.host import syscalls
from agent_sandbox.backends.runc.host.guest_python import GUEST_EXE
from agent_sandbox.backends.runc.host.mode import RESOLV_CONF, SharedFiles
from agent_sandbox.core.errors import RuntimeUnavailableError

_MS_NOSUID, _MS_NODEV = 2, 4
# Room for many versions of the guest (about 0.5 MB each): a new one is staged only
# when the guest's files change while sandboxes keep the stage mounted.
_OPTIONS = "size=32m,nr_inodes=8192,mode=0755"
_MAX_FILES = 512  # the guest is a few dozen modules and their bytecode

# (relative path, mtime_ns, content) of each regular file
Tree = list[tuple[str, int, bytes]]


class Stage:
    def __init__(self, root: Path, lock: Callable[[], AbstractContextManager[None]]) -> None:
        self.root = root
        self._lock = lock
        self._guest: tuple[Path, str, Tree] | None = None  # read once per process

    def files(self, guest_dir: Path) -> SharedFiles:
        """The staged copies of the guest's code, the empty file and resolv.conf; staged
        first where missing (another process may have released the stage)."""
        name, tree = self._snapshot(guest_dir)
        out = SharedFiles(guest_dir=str(self.root / name), empty_file=str(self.root / "empty"),
                          resolv_file=str(self.root / "resolv.conf"))
        if os.path.isdir(out.guest_dir):  # made last, on a mounted stage
            return out
        with self._lock():
            if not os.path.ismount(self.root):
                self.root.mkdir(mode=0o755, exist_ok=True)
                syscalls.mount("tmpfs", str(self.root), "tmpfs", _MS_NOSUID | _MS_NODEV,
                               _OPTIONS)
            for path, text in ((out.empty_file, ""), (out.resolv_file, RESOLV_CONF)):
                if not os.path.exists(path):
                    _write(Path(path), text.encode(), 0o444)
            if not os.path.isdir(out.guest_dir):
                self._copy(name, tree)
        return out

    def _snapshot(self, guest_dir: Path) -> tuple[str, Tree]:
        if self._guest is None or self._guest[0] != guest_dir:
            tree = _read_tree(guest_dir)
            digest = hashlib.sha256()
            for rel, _, data in tree:
                digest.update(f"{rel}\0{len(data)}\0".encode())
                digest.update(data)
            self._guest = (guest_dir, f"guest-{digest.hexdigest()[:16]}", tree)
        return self._guest[1], self._guest[2]

    def _copy(self, name: str, tree: Tree) -> None:
        """Into a temporary directory, then renamed: a half-made copy is never used."""
        tmp = self.root / f".{name}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed copy of this pid's
        try:
            _open_dir(tmp)
            for rel, mtime_ns, data in tree:
                path = tmp / rel
                for folder in reversed(path.relative_to(tmp).parents[:-1]):
                    _open_dir(tmp / folder)
                _write(path, data, 0o644)
                os.utime(path, ns=(mtime_ns, mtime_ns))  # keeps the bytecode valid
            _compile(tmp)
            os.rename(tmp, self.root / name)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                raise RuntimeUnavailableError(
                    f"no room left in {self.root} for another version of the guest agent's "
                    "code (it changed many times while sandboxes ran): kill every sandbox "
                    "(the stage is then released) and create again") from exc
            raise


def _read_tree(guest_dir: Path) -> Tree:
    """The guest's regular files (links and anything else left out), read once."""
    tree: Tree = []

    def fail(exc: OSError) -> None:
        raise RuntimeUnavailableError(f"cannot read the guest agent's code: {exc}") from exc

    for folder, dirs, names in os.walk(guest_dir, onerror=fail):
        dirs.sort()
        for name in sorted(names):
            if not name.endswith((".py", ".pyc")):
                continue  # a bytecode file another Python is writing (x.pyc.<number>)
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode):
                    continue
                with open(path, "rb") as fh:
                    data = fh.read()
            except FileNotFoundError:
                continue  # replaced by another Python's bytecode write meanwhile
            except OSError as exc:
                fail(exc)
            if len(tree) >= _MAX_FILES:
                raise RuntimeUnavailableError(f"{guest_dir} holds more than {_MAX_FILES} "
                                              "files: not the guest agent's code")
            tree.append((os.path.relpath(path, guest_dir), st.st_mtime_ns, data))
    if not tree:
        raise RuntimeUnavailableError(f"{guest_dir} holds no guest agent code")
    return tree


def _compile(folder: Path) -> None:
    """The guest's bytecode for the interpreter it runs on (the host's python3): on the
    read-only stage, code without it is compiled again at each sandbox's start (a fifth
    of a create). Best effort: without it the guest starts as before."""
    try:
        subprocess.run([GUEST_EXE, "-I", "-m", "compileall", "-q", str(folder)],
                       capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return
    for cache in folder.rglob("__pycache__"):  # whatever the umask: every sandbox reads it
        os.chmod(cache, 0o755)
        for pyc in cache.iterdir():
            os.chmod(pyc, 0o644)


def _open_dir(path: Path) -> None:
    """A directory every sandbox's root can enter, whatever the umask (077 made it 0700,
    and the guest could not start)."""
    path.mkdir(mode=0o755, exist_ok=True)
    os.chmod(path, 0o755)


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        os.fchmod(fh.fileno(), mode)  # whatever the umask
