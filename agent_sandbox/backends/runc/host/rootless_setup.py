"""What the engine needs to run sandboxes as an ordinary user (rootless mode).

- the id mapping: the user's own uid/gid is root inside; ids 1..65535 come from the user's
  /etc/subuid and /etc/subgid ranges through newuidmap/newgidmap (runc calls them) when
  present, otherwise the sandbox has that one id only;
- how limits are enforced: cgroups only where cgroup v2 delegates controllers to the
  user (systemd), otherwise per-process rlimits;
- removing trees that sandboxes wrote with subordinate ids (the user cannot unlink those
  on the host: the removal runs in a user namespace with the sandboxes' mapping);
- volumes are plain directories (no loop devices without root: no disk quota either).
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_sandbox.backends.runc.host import subids
from agent_sandbox.backends.runc.oci import bundle as oci
from agent_sandbox.backends.runc.rootfs import disk
from agent_sandbox.config.engine import Limits
from agent_sandbox.core.errors import RuntimeUnavailableError

_SUB_SIZE = 65535  # container ids 1..65535, as the root engine's 65536-id range
_TOOLS_PATH = "/usr/bin:/usr/sbin:/bin:/sbin"


@dataclass(frozen=True)
class IdMap:
    uid: int
    gid: int
    sub_uid: tuple[int, int] | None = None  # (host start, size) for container ids 1..
    sub_gid: tuple[int, int] | None = None

    @property
    def full(self) -> bool:
        return self.sub_uid is not None and self.sub_gid is not None

    def oci(self) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
        """``uidMappings``/``gidMappings`` for config.json."""
        uids = [{"containerID": 0, "hostID": self.uid, "size": 1}]
        gids = [{"containerID": 0, "hostID": self.gid, "size": 1}]
        if self.full:
            assert self.sub_uid is not None and self.sub_gid is not None
            uids.append({"containerID": 1, "hostID": self.sub_uid[0], "size": self.sub_uid[1]})
            gids.append({"containerID": 1, "hostID": self.sub_gid[0], "size": self.sub_gid[1]})
        return uids, gids

    def describe(self) -> str:
        text = f"uid {self.uid} -> 0"
        if self.full:
            assert self.sub_uid is not None
            start, size = self.sub_uid
            return f"{text}, subuids {start}-{start + size - 1} -> 1-{size}"
        return f"{text} only (no /etc/subuid range or no newuidmap: a single-id sandbox)"


def _sub_range(path: Path, name: str, uid: int) -> tuple[int, int] | None:
    for owner, start, size in subids.ranges(_read(str(path))):
        if owner in (name, str(uid)) and size > 0:
            return start, min(size, _SUB_SIZE)
    return None


@functools.cache
def id_map() -> IdMap:
    uid, gid = os.getuid(), os.getgid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    tools = all(shutil.which(t, path=f"{os.environ.get('PATH', '')}:{_TOOLS_PATH}")
                for t in ("newuidmap", "newgidmap"))
    sub_uid = _sub_range(Path("/etc/subuid"), name, uid)
    sub_gid = _sub_range(Path("/etc/subgid"), name, uid)
    if not tools or sub_uid is None or sub_gid is None:
        return IdMap(uid, gid)
    size = min(sub_uid[1], sub_gid[1])
    return IdMap(uid, gid, (sub_uid[0], size), (sub_gid[0], size))


@functools.cache
def userns_problem() -> str | None:
    """Why unprivileged user namespaces do not work here, or None when they do."""
    raw = _read("/proc/sys/user/max_user_namespaces").strip()
    if raw == "0":
        return ("user namespaces are disabled (user.max_user_namespaces = 0): "
                "sysctl -w user.max_user_namespaces=15000")
    if _read("/proc/sys/kernel/unprivileged_userns_clone").strip() == "0":
        return ("unprivileged user namespaces are disabled: "
                "sysctl -w kernel.unprivileged_userns_clone=1")
    unshare = shutil.which("unshare", path=_TOOLS_PATH)
    if unshare is None:
        return "unshare (util-linux) is missing: apt-get install util-linux"
    proc = subprocess.run([unshare, "--user", "--map-root-user", "true"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return f"cannot create a user namespace: {proc.stderr.strip() or proc.returncode}"
    return None


def check_usable() -> None:
    problem = userns_problem()
    if problem:
        raise RuntimeUnavailableError(
            f"the rootless engine needs unprivileged user namespaces: {problem}. Or run as "
            "root, or point ABX_SANDBOX_BASE_URL at a sandbox gateway (see `abx doctor`)")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


# limits ---------------------------------------------------------------------------------
@functools.cache
def delegated_cgroup() -> str | None:
    """The user's systemd-delegated cgroup v2 directory when it offers memory and pids
    (runc then limits through systemd, ``--systemd-cgroup``), else None. cgroup v1 and
    hybrid hosts never delegate to users."""
    root = Path("/sys/fs/cgroup")
    if not (root / "cgroup.controllers").exists():
        return None  # v1 or hybrid
    uid = os.getuid()
    service = root / "user.slice" / f"user-{uid}.slice" / f"user@{uid}.service"
    controllers = set(_read(str(service / "cgroup.controllers")).split())
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    bus = os.environ.get("DBUS_SESSION_BUS_ADDRESS") or \
        (f"unix:path={runtime_dir}/bus" if Path(runtime_dir, "bus").exists() else "")
    if {"memory", "pids"} <= controllers and os.access(service, os.W_OK) and bus:
        return str(service)
    return None


def enforced_limits() -> dict[str, bool]:
    """Which limits really hold in rootless mode. cgroup keys (memory, pids, cpu, disk)
    mean a total for the sandbox; the rlimit keys are weaker: memory_per_process is each
    process's address space, pids_per_uid counts the processes of each uid inside,
    file_size caps any one file."""
    cg = delegated_cgroup()
    controllers = set(_read(str(Path(cg) / "cgroup.controllers")).split()) if cg else set()
    return {"memory": "memory" in controllers, "pids": "pids" in controllers,
            "cpu": "cpu" in controllers, "disk": False,
            "memory_per_process": True, "pids_per_uid": True, "file_size": True}


def rlimits(limits: Limits, *, cgroups: bool = False) -> list[dict[str, Any]]:
    """``process.rlimits`` standing in for cgroups (inherited by every process inside);
    with delegated cgroups only the file size one (no cgroup limits a file). The
    address-space limit is not among them: runc's own Go init runs under these and needs
    more address space than a small sandbox gets (see ``guest_env``)."""
    fsize = limits.disk_mb * 1024 * 1024
    out = [{"type": "RLIMIT_FSIZE", "hard": fsize, "soft": fsize}]
    if not cgroups:
        out.append({"type": "RLIMIT_NPROC", "hard": limits.pids, "soft": limits.pids})
    return out


def guest_env(limits: Limits, *, cgroups: bool = False) -> list[str]:
    """Environment for the guest: without cgroups, the address-space limit it puts on
    every process it starts (not on itself, nor on runc's init: both need more address
    space than a small sandbox gets). Inside, nobody may raise a hard limit."""
    if cgroups:
        return []
    return [f"ABX_GUEST_RLIMIT_AS={limits.memory_mb * 1024 * 1024}"]


def describe_limits() -> dict[str, str]:
    cg = delegated_cgroup()
    if cg:
        how = f"cgroup v2 delegated by systemd ({cg})"
        return {"memory": how, "pids": how, "cpu": how,
                "disk": "not enforced (no quota without root); file size via RLIMIT_FSIZE"}
    return {
        "memory": "per process only: RLIMIT_AS (no cgroup delegation on this host); "
                  "the sandbox's total is not bounded, its tmpfs are: /dev/shm at most "
                  "the memory limit (64 MiB at most) and "
                  f"{oci.SHM_INODES} files, /dev {oci.DEV_SIZE_KB} KiB and "
                  f"{oci.DEV_INODES} files",
        "pids": "per uid inside the sandbox: RLIMIT_NPROC (no cgroup delegation)",
        "cpu": "not enforced (no cgroup delegation on this host)",
        "disk": "not enforced (no quota without root); one file at most disk_mb "
                "(RLIMIT_FSIZE)",
    }


# trees ----------------------------------------------------------------------------------
def remove_tree(path: Path) -> None:
    """``rm -rf`` of a tree sandboxes wrote, whatever ids inside wrote it."""
    if not os.path.lexists(path):
        return
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return
    mapping = id_map()
    argv = ["unshare", "--user", "--map-root-user"]
    if mapping.full:
        assert mapping.sub_uid is not None and mapping.sub_gid is not None
        argv += [f"--map-users={mapping.sub_uid[0]},1,{mapping.sub_uid[1]}",
                 f"--map-groups={mapping.sub_gid[0]},1,{mapping.sub_gid[1]}"]
    # Root of that namespace may remove anything owned by its ids (mode 000 dirs too).
    subprocess.run([*argv, "rm", "-rf", "--one-file-system", "--", str(path)],
                   capture_output=True, env={"PATH": _TOOLS_PATH})


def make_volume(folder: Path) -> None:
    """A directory volume: ``sys/`` (system layer uppers) and ``workspace/``."""
    for name in (disk.SYSTEM, disk.WORKSPACE):
        (folder / name).mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
