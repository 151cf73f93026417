"""Templates root builds once for every user of the host (``code-interpreter-v1``).

They live in ``ABX_SHARED_TEMPLATES_DIR`` (default ``/var/lib/agent-sandbox-templates``),
each as ``<name>/template.json`` and ``<name>/rootfs-*/`` holding only the template's own
layers: every engine (root's, the daemon's, each user's rootless one) stacks them on its
own ``base``. Nothing of them is copied per user.

The one rule: an ordinary user must not be able to plant a template other users run. A
shared template is used only when every directory from ``/`` down to its files is root's
and nobody else may write it (an ancestor that is world-writable but sticky, like
``/var/tmp``, is passed: nobody else may rename or remove root's entries in it). The path
is walked component by component on descriptors opened with ``O_NOFOLLOW``, never by
following a link; ``template.json`` must be a root-owned regular file nobody else may
write; and the whole tree (every entry root's, none writable by group or others) is
checked once per process before its first use. Anything else is ignored, and why is
logged.

Rootless sandboxes see root's files as owned by an unmapped id: they can read and run
them, but overlay cannot copy them up. A user-owned mirror of the template's directories
(directories only, a few MB) is stacked above them, so new files and removals land in the
sandbox's system layer (``pip install`` of a new package works); changing or renaming a
file of the shared template in place does not.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import threading
import time
from pathlib import Path

from agent_sandbox.backends.runc.templates.store import sweep_leftovers
from agent_sandbox.core.errors import InvalidArgumentError, RuntimeUnavailableError
from agent_sandbox.core.templates import Layer, Template, validate_name

log = logging.getLogger(__name__)

_O_DIR = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_ROOTFS_RE = re.compile(r"^rootfs-[0-9a-f]{1,32}\Z")
_MAX_META = 1 << 20
MIRRORS = "_shared"  # in a user's own template store: not a valid template name


class Untrusted(Exception):
    """Why a shared template (or the shared directory) must not be used."""


def _check(fd: int, shown: str, *, passable: bool = False) -> os.stat_result:
    st = os.fstat(fd)
    if st.st_uid != 0:
        raise Untrusted(f"{shown} is owned by uid {st.st_uid}, not root")
    if st.st_mode & 0o022 and not (passable and st.st_mode & stat.S_ISVTX):
        raise Untrusted(f"{shown} is writable by group or others "
                        f"(mode {stat.S_IMODE(st.st_mode):o})")
    return st


def _open_step(parent: int, name: str, shown: str) -> int:
    try:
        return os.open(name, _O_DIR, dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError as exc:  # ENOTDIR: a symlink or a file; EACCES: not ours to read
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        if link:
            raise Untrusted(f"{shown} is a symbolic link (never followed)") from None
        raise Untrusted(f"{shown} is not a directory we may use ({exc.strerror})") from None


def open_trusted_dir(path: Path) -> int:
    """An O_PATH descriptor of ``path``, every component checked (``Untrusted`` if one
    fails; ``FileNotFoundError`` if it does not exist). The last component must not be
    writable by others even when sticky."""
    if not path.is_absolute() or ".." in path.parts:
        raise Untrusted(f"{path} is not an absolute path without '..'")
    fd = os.open("/", _O_DIR)
    try:
        parts = path.parts[1:]
        _check(fd, "/", passable=bool(parts))
        shown = ""
        for index, part in enumerate(parts):
            shown += "/" + part
            child = _open_step(fd, part, shown)
            os.close(fd)
            fd = child
            _check(fd, shown, passable=index < len(parts) - 1)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_meta(folder_fd: int, shown: str) -> dict[str, object]:
    try:
        fd = os.open("template.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError as exc:
        raise Untrusted(f"{shown}/template.json cannot be opened ({exc.strerror})") from None
    try:
        st = _check(fd, f"{shown}/template.json")
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_META:
            raise Untrusted(f"{shown}/template.json is not a regular file of at most 1 MiB")
        data = os.read(fd, _MAX_META + 1)
    finally:
        os.close(fd)
    try:
        meta = json.loads(data)
    except ValueError:
        raise Untrusted(f"{shown}/template.json is not JSON") from None
    if not isinstance(meta, dict):
        raise Untrusted(f"{shown}/template.json is not a JSON object")
    return meta


_verified: dict[str, list[tuple[str, int]]] = {}
_verified_lock = threading.Lock()


def verify_tree(rootfs: Path) -> list[tuple[str, int]]:
    """Every entry under ``rootfs`` root's and none writable by group or others (links
    are not followed). Returns its directories (relative path, mode), parents first.
    Once per process and tree (a rebuild is a new ``rootfs-*`` directory)."""
    with _verified_lock:  # one walk at a time: a pool filling and a create may both ask
        known = _verified.get(str(rootfs))
        if known is None:
            known = _verify_tree(rootfs)
            _verified[str(rootfs)] = known
    return known


def _verify_tree(rootfs: Path) -> list[tuple[str, int]]:
    fd = open_trusted_dir(rootfs)
    os.close(fd)
    dirs: list[tuple[str, int]] = []
    for dirpath, dirnames, filenames, dirfd in os.fwalk(rootfs, follow_symlinks=False):
        rel = os.path.relpath(dirpath, rootfs)
        for name in dirnames + filenames:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            shown = os.path.join(dirpath, name)
            if st.st_uid != 0:
                raise Untrusted(f"{shown} is owned by uid {st.st_uid}, not root")
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
                raise Untrusted(f"{shown} is writable by group or others")
            if stat.S_ISDIR(st.st_mode):
                dirs.append((os.path.normpath(os.path.join(rel, name)),
                             stat.S_IMODE(st.st_mode)))
    return dirs


class SharedTemplates:
    """The host's shared templates, as one engine sees them."""

    def __init__(self, root: Path, *, mirror_dirs: bool) -> None:
        self.root = Path(root)
        # Rootless: stack a user-owned mirror of the directories above root's files.
        self.mirror_dirs = mirror_dirs
        self._warned: set[str] = set()

    @property
    def builder(self) -> bool:
        """Root builds shared templates; everyone else only uses them."""
        return os.geteuid() == 0

    def refused(self, reason: str) -> None:
        """Log (once) why a shared template is not used."""
        if reason not in self._warned:
            self._warned.add(reason)
            log.warning("not using the shared template: %s", reason)

    def names(self) -> list[str]:
        try:
            fd = open_trusted_dir(self.root)
        except (FileNotFoundError, Untrusted):
            return []
        try:
            listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        try:
            entries = os.listdir(listing)
        finally:
            os.close(listing)
        return sorted(n for n in entries if not n.startswith(".") and _valid(n))

    def load(self, name: str) -> Template | None:
        """The template's own layers and metadata, or None (absent or refused)."""
        try:
            return self.check(name)
        except FileNotFoundError:
            return None
        except Untrusted as exc:
            self.refused(str(exc))
            return None

    def check(self, name: str) -> Template:
        """Like ``load``; raises ``Untrusted`` (why) or ``FileNotFoundError``."""
        folder = self.root / validate_name(name)
        top = open_trusted_dir(self.root)  # itself never writable by others, even sticky
        try:
            fd = _open_step(top, name, str(folder))
        finally:
            os.close(top)
        try:
            _check(fd, str(folder))
            meta = _read_meta(fd, str(folder))
            try:
                tmpl = Template.from_json(meta)
            except (TypeError, KeyError, ValueError):
                raise Untrusted(f"{folder}/template.json is not a template") from None
            if tmpl.name != name:
                raise Untrusted(f"{folder}/template.json names {tmpl.name!r}")
            for layer in tmpl.layers:
                for lower in layer.lowers:
                    if not isinstance(lower, str):
                        raise Untrusted(f"{folder}/template.json names a layer {lower!r}")
                    child = Path(lower)
                    if child.parent != folder or not _ROOTFS_RE.match(child.name):
                        raise Untrusted(f"{folder}/template.json names a layer outside "
                                        f"it: {lower!r}")
                    os.close(_check_child(fd, child))
        finally:
            os.close(fd)
        return tmpl

    def composed(self, base: Template, tmpl: Template, own_root: Path) -> list[Layer] | None:
        """``layers_on``, or None (the reason logged once) if ``tmpl``'s tree turns out
        not to be root's alone."""
        try:
            return self.layers_on(base, tmpl, own_root)
        except (Untrusted, OSError) as exc:
            self.refused(str(exc))
            return None

    def layers_on(self, base: Template, tmpl: Template, own_root: Path) -> list[Layer]:
        """``tmpl``'s own layers on top of ``base``'s (its whole tree checked first);
        rootless, under a mirror of its directories made in ``own_root``."""
        tops: dict[str, list[str]] = {}
        for layer in tmpl.layers:
            lowers = list(layer.lowers)
            if self.mirror_dirs:  # made once per user and build, after checking the tree
                lowers = [str(_mirror(own_root, tmpl.name, Path(lower)))
                          for lower in lowers] + lowers
            else:
                for lower in lowers:
                    verify_tree(Path(lower))
            tops.setdefault(layer.target, []).extend(lowers)
        out = [Layer(layer.target, [*tops.pop(layer.target, []), *layer.lowers])
               for layer in base.layers]
        return out + [Layer(target, lowers) for target, lowers in tops.items()]

    # root: building and removing -------------------------------------------------------
    def prepare_root(self) -> Path:
        """Root: the shared directory, made if missing (0755), checked before building."""
        if not self.builder:
            raise RuntimeUnavailableError("only root builds shared templates")
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        sweep_leftovers(self.root)  # builds and removals dead processes left half done
        st = os.lstat(self.root)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and st.st_mode & 0o022:
            os.chmod(self.root, 0o755)
        try:
            os.close(open_trusted_dir(self.root))
        except Untrusted as exc:
            raise RuntimeUnavailableError(
                f"cannot build shared templates in {self.root}: {exc}; make it root's "
                f"(chown root:root, chmod 755) or set ABX_SHARED_TEMPLATES_DIR") from None
        return self.root

    def remove(self, name: str) -> None:
        if not self.builder:
            raise InvalidArgumentError(
                f"template {name!r} is this host's shared template (in {self.root}); only "
                "root can remove it")
        folder = self.root / validate_name(name)
        trash = self.root / f".trash-{name}-{os.getpid()}-{time.time_ns()}"
        os.replace(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)


def _valid(name: str) -> bool:
    try:
        validate_name(name)
    except InvalidArgumentError:
        return False
    return True


def _check_child(parent_fd: int, child: Path) -> int:
    try:
        fd = _open_step(parent_fd, child.name, str(child))
    except FileNotFoundError:
        raise Untrusted(f"{child} is missing") from None
    try:
        _check(fd, str(child))
    except BaseException:
        os.close(fd)
        raise
    return fd


def seal_tree(top: Path) -> None:
    """After a build as root: nothing below ``top`` writable by group or others."""
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)
    os.chmod(top, 0o755)


def _umask() -> int:
    """This process's umask, read without changing it (0o777: unknown, chmod always)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o777


def _mirror(own_root: Path, name: str, lower: Path) -> Path:
    """The user's mirror of a shared layer's directories, made (after ``verify_tree``)
    once per user and layer: its existence says this user checked that tree."""
    folder = own_root / MIRRORS / name
    target = folder / lower.name
    if target.is_dir():
        return target
    with _mirror_lock:  # one maker per process; other processes: the rename below
        if target.is_dir():
            return target
        _make_mirror(folder, target, verify_tree(lower))
    for old in folder.iterdir():  # mirrors of builds root has replaced since
        if old.name != target.name and not old.name.startswith(".") \
                and not (lower.parent / old.name).exists():
            shutil.rmtree(old, ignore_errors=True)
    return target


_mirror_lock = threading.Lock()


def _make_mirror(folder: Path, target: Path, dirs: list[tuple[str, int]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".tmp-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(mode=0o755)
    umask = _umask()
    try:
        for rel, mode in dirs:
            wanted = mode & 0o1755 | 0o700
            os.mkdir(os.path.join(tmp, rel), wanted)
            if wanted & ~umask != wanted:
                os.chmod(os.path.join(tmp, rel), wanted)
        os.chmod(tmp, 0o755)
        try:
            os.replace(tmp, target)
        except OSError:  # another process made it first: theirs is as good
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
