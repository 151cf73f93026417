"""Memory checkpoints of a sandbox's container: CRIU through runc.

A checkpoint writes the container's processes and memory to an image directory on the
host and stops the container; a restore starts a container (the same sandbox, or a new
one: a fork) from it. The guest's listener and the host's connections to it belong to
the host's network namespace, which CRIU cannot dump, so the guest is *parked* first
(``guest.server.park``): it closes them all and holds a placeholder socket where its
listener was. The host names the socket the guest holds in its place to CRIU (``inherit-fd``: runc's
stdout, a new listener the host bound), so the restored guest finds it at that fd.

An image is host-only state (root's, read by the sandboxes' root alone for the restore:
``fresh_image_dir``; in the sandbox's host directory or the snapshots directory, never in
a tree the sandbox can write) and, being written from hostile
processes, is given to CRIU only: nothing here parses it, except the files this module
writes itself (``listener``, ``descriptors.json``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from agent_sandbox.backends.runc import criu
from agent_sandbox.backends.runc.runc import Runc
from agent_sandbox.config.engine import HOST_ID_BASE
from agent_sandbox.core.errors import RuntimeUnavailableError
from agent_sandbox.guestlink.client import GuestClient, GuestUnavailableError

_PARK_WAIT = 8.0  # seconds for a guest to close its connections and listener
_LISTENER_FD = 3  # the guest's listener (runc --preserve-fds 1)
_DUMP_ATTEMPTS = 3
_QUICK_REFUSAL = 2.0  # seconds: a refusal this quick may be a race, tried again
_FREEZE_TIMEOUT = 4  # seconds for CRIU to freeze the sandbox's processes
_SOCKET = re.compile(r"^socket:\[\d+\]$")
LISTENER = "listener"  # in an image: the guest's placeholder, which the listener replaces
DESCRIPTORS = "descriptors.json"  # in an image: runc's record of the stdio it restores
WORK = "work"  # logs of the last dump / restore, beside the image


class CheckpointError(RuntimeUnavailableError):
    """A checkpoint that did not happen: the sandbox's processes still run."""


def criu_binary() -> str:
    """The CRIU to use, or a clear error naming the fix."""
    found = criu.find()
    if not found.ok:
        raise RuntimeUnavailableError(f"memory snapshots are not available here: "
                                      f"{criu.problem()}")
    criu.keep_kernel_cache(found.path)
    return found.path


def fresh_image_dir(path: Path) -> Path:
    """An empty, host-only image directory (an earlier image there is replaced).

    A restore reads most images (memory, mappings, namespaces) after entering the
    sandbox's user namespace, as its root: host id ``HOST_ID_BASE``, which the kernel
    treats as any other unprivileged user there. So the directory is root's, entered by
    that group alone (0710, never listed), and ``seal`` leaves the images root's, read by
    that group alone (0640); setgid, so what CRIU writes takes the group. No other host
    user reaches an image; the sandboxes' root reaches none of the host's own files in it.
    """
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700, parents=True)
    os.chown(path, 0, HOST_ID_BASE)
    os.chmod(path, 0o2710)
    (path / WORK).mkdir(mode=0o700)
    return path


_OWN_FILES = (LISTENER, DESCRIPTORS)


def seal(image_dir: Path) -> None:
    """The images CRIU just wrote (0644 by its umask) readable by the sandboxes' root
    only (0640, the directory's group); the host's own records and logs root's alone."""
    for entry in os.scandir(image_dir):
        if entry.is_file(follow_symlinks=False):
            os.chmod(entry.path, 0o600 if entry.name in _OWN_FILES else 0o640)
    for entry in os.scandir(image_dir / WORK):
        if entry.is_file(follow_symlinks=False):
            os.chmod(entry.path, 0o600)


CONFIG = "criu.conf"  # in the sandbox's host directory; the bundle's annotation names it


def annotate(config: dict[str, Any], sandbox_dir: Path) -> None:
    """runc reads CRIU options from the file this annotation names (none: ignored); the
    annotation must be in the bundle the container started from."""
    config.setdefault("annotations", {})["org.criu.config"] = str(sandbox_dir / CONFIG)


def _external_key(target: str) -> str:
    return "abx-layer" + target.replace("/", "-")


def _write_config(sandbox_dir: Path, lines: list[str]) -> None:
    _write_private(sandbox_dir / CONFIG, "".join(f"{line}\n" for line in lines))


def dump(runc: Runc, container_id: str, sandbox_dir: Path, socket_path: str,
         image_dir: Path, layer_targets: list[str]) -> None:
    """Park the guest, then checkpoint the container into ``image_dir`` (stopping it).

    CheckpointError when the container still runs afterwards (CRIU refused): its guest
    is parked then, unreachable until the container is started again."""
    binary = criu_binary()
    state = runc.state(container_id)
    if not state or state.get("status") != "running":
        raise RuntimeUnavailableError(f"sandbox {container_id} has no running container "
                                      "to checkpoint")
    pid = int(state["pid"])
    listener = _fd_link(pid)
    try:
        GuestClient(socket_path, io_timeout=_PARK_WAIT).park()
    except GuestUnavailableError as exc:
        raise CheckpointError(f"sandbox {container_id}'s guest did not answer: {exc}") \
            from None
    placeholder = _placeholder(pid, listener)
    # The overlays the host mounted below the root (a template's /usr) are the host's:
    # CRIU leaves them to the restore, which binds the new container's own.
    _write_config(sandbox_dir, [
        # Processes that will not freeze (one under ptrace) fail the dump within this,
        # not CRIU's 10 s.
        f"timeout {_FREEZE_TIMEOUT}",
        *(f"external mnt[{t}]:{_external_key(t)}" for t in layer_targets if t != "/")])
    # Frozen before CRIU starts: CRIU's own wait for the freezer sleeps 100 ms before it
    # looks again, runc's returns once the cgroup is frozen. CRIU then dumps it as it
    # finds it (the image records a frozen cgroup: ``restore`` thaws the copy).
    runc.pause(container_id)
    for attempt in range(_DUMP_ATTEMPTS):
        started = time.monotonic()
        try:
            runc.checkpoint(container_id, binary, image_dir, image_dir / WORK)
            break
        except RuntimeUnavailableError as exc:
            # CRIU left the processes as they were (frozen). A quick refusal may be a
            # race (a child exiting mid-dump): again, while the guest is still parked; a
            # slow one (processes that would not freeze) is not tried again.
            alive = runc.state(container_id)
            if attempt + 1 == _DUMP_ATTEMPTS or not alive or \
                    alive.get("status") not in ("running", "paused") or \
                    time.monotonic() - started > _QUICK_REFUSAL:
                raise CheckpointError(str(exc)) from None
            time.sleep(0.05)
    # What the restore hands over: the placeholder, by its inode (host-written, from
    # /proc, which the sandbox cannot forge); no pipe of the boot's for runc to pass on.
    _write_private(image_dir / LISTENER, placeholder)
    _write_private(image_dir / DESCRIPTORS, json.dumps(["/dev/null"] * 3))
    seal(image_dir)


def _fd_link(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/fd/{_LISTENER_FD}")
    except OSError:
        return ""


def _placeholder(pid: int, listener: str) -> str:
    """The socket the parked guest holds at its listener's fd, as CRIU names it."""
    deadline = time.monotonic() + _PARK_WAIT
    link = ""
    while time.monotonic() < deadline:
        link = _fd_link(pid)
        if _SOCKET.match(link) and link != listener:
            return link
        time.sleep(0.001)
    raise CheckpointError(f"the guest did not park within {_PARK_WAIT:.0f} s (its fd "
                          f"{_LISTENER_FD} is {link or 'gone'})")


def restore(runc: Runc, container_id: str, bundle: Path, image_dir: Path, work: Path,
            listener: int, layer_targets: list[str]) -> None:
    """Start ``container_id`` from ``image_dir`` with ``bundle``'s config (its rootfs
    mounted); the guest's listener becomes ``listener`` (a socket the host bound). The
    image is only read: any number of sandboxes may start from it at once."""
    binary = criu_binary()
    rootfs = bundle / "rootfs"
    # mount-v2 remounts the root overlay from its options (descriptor paths of the host's
    # mount call): the compatible engine bind-mounts the root runc gives it instead.
    placeholder = (image_dir / LISTENER).read_text()
    if not _SOCKET.match(placeholder):
        raise RuntimeUnavailableError(f"checkpoint image {image_dir} is incomplete (no "
                                      "listener record): delete it")
    _write_config(bundle, [
        "mntns-compat-mode",
        # runc's stdout (the listener) replaces the guest's placeholder socket.
        f"inherit-fd fd[1]:{placeholder}",
        *(f"external mnt[{_external_key(t)}]:{rootfs / t.lstrip('/')}"
          for t in layer_targets if t != "/")])
    with_loopback_hook(bundle / "config.json")
    runc.restore(container_id, binary, bundle, image_dir, work, listener)
    runc.thaw(container_id)  # an image of a frozen cgroup (``dump``) restores frozen


# runc restores the network namespace with `lo` down: loopback servers and the guest's
# port forwards need it up before the processes run again. The hook reads the container's
# state (runc's JSON, on one line: ids and paths of the host's) for its pid; a shell, not
# an interpreter, as it runs inside every restore's own time.
_LO_UP = ('read -r s; p=${s#*\\"pid\\":}; p=${p%%[!0-9]*}; '
          '[ -n "$p" ] || exit 1; '
          'exec nsenter -t "$p" -n ip link set lo up')
_LO_HOOK = "abx-loopback-up"  # the hook's $0: how a bundle's copy of it is recognised


def with_loopback_hook(config_path: Path) -> None:
    """Add the createRuntime hook that brings `lo` up (once), and the CRIU options' file, to
    a host-written bundle."""
    config: dict[str, Any] = json.loads(config_path.read_text())
    annotate(config, config_path.parent)
    hooks = config.setdefault("hooks", {}).setdefault("createRuntime", [])
    if not any(h.get("args", [])[:1] == [_LO_HOOK] for h in hooks):
        hooks.append({"path": "/bin/sh", "args": [_LO_HOOK, "-c", _LO_UP],
                      "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "timeout": 10})
    tmp = config_path.with_name(f".{config_path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(config))
    os.replace(tmp, config_path)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
