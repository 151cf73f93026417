"""Writes the OCI runtime ``config.json`` for one sandbox from our isolation policy."""

from __future__ import annotations

import copy
import os
import resource
from dataclasses import dataclass
from typing import Any

from agent_sandbox.backends.runc.oci.seccomp import seccomp_profile
from agent_sandbox.config.engine import HOST_ID_BASE, HOST_ID_COUNT, Limits
from agent_sandbox.core.inside import CAPABILITIES, DEFAULT_PATH, GUEST_DIR, GUEST_RUN_DIR

DEV_SIZE_KB, DEV_INODES = 1024, 1024  # device nodes and a few links
SHM_INODES = 16384
GUEST_LISTEN_FD = 3  # the host's listener, passed with runc --preserve-fds

MASKED_PATHS = [
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware", "/sys/devices/virtual/powercap", "/sys/kernel/debug",
]
READONLY_PATHS = [
    "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
    # pid 1 imports by path names under /.abx (its code, the host's /usr): as a plain
    # directory of the writable layer it could be renamed away and a new /.abx/guest
    # made in its place. A read-only mount cannot be renamed, removed or added to; the
    # mounts under it keep their own flags (/.abx/run stays writable).
    os.path.dirname(GUEST_DIR),
]

_GUEST_BOOT = f"import sys; sys.path.insert(0, {GUEST_DIR!r}); import agent; agent.main()"



@dataclass(frozen=True)
class BundleSpec:
    sandbox_id: str
    rootfs: str
    workspace: str
    run_dir: str
    guest_dir: str
    python: list[str]
    limits: Limits
    extra_mounts: tuple[dict[str, Any], ...] = ()
    # A host-owned empty file mounted read-only over /etc/ld.so.preload: the guest's
    # loader must not take a library from the sandbox's writable /etc.
    empty_file: str | None = None
    # Host-owned, read-only: the policy resolver's address (host_mode.resolv_file).
    resolv_file: str | None = None


@dataclass(frozen=True)
class UserHost:
    """What changes when the engine runs as an ordinary user: the user's id mapping
    (uids, gids), the overlays runc mounts inside the container (before everything
    else), rlimits standing in for cgroups, and how cgroups are reached ("systemd": a
    user's delegated cgroup v2; "": none, no cgroup can be written)."""

    id_map: tuple[list[dict[str, int]], list[dict[str, int]]]
    rootfs_mounts: tuple[dict[str, Any], ...] = ()
    rlimits: tuple[dict[str, Any], ...] = ()
    cgroups: str = ""


def _bind(source: str, dest: str, *, readonly: bool) -> dict[str, Any]:
    opts = ["rbind", "nosuid", "nodev"] + (["ro"] if readonly else ["rw"])
    return {"destination": dest, "type": "bind", "source": source, "options": opts}


def _mounts(spec: BundleSpec) -> list[dict[str, Any]]:
    return [
        {"destination": "/proc", "type": "proc", "source": "proc",
         "options": ["nosuid", "noexec", "nodev"]},
        # Capped in size and inodes: a tmpfs is host memory, and rootless sandboxes have
        # no cgroup to charge it to.
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", f"size={DEV_SIZE_KB}k",
                     f"nr_inodes={DEV_INODES}"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777",
                     f"size={min(64, spec.limits.memory_mb)}m", f"nr_inodes={SHM_INODES}"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
        _bind(spec.workspace, "/workspace", readonly=False),
        _bind(spec.guest_dir, GUEST_DIR, readonly=True),
        # noexec matches the host's tmpfs: a userns may not clear a locked flag.
        {**_bind(spec.run_dir, GUEST_RUN_DIR, readonly=False),
         "options": ["rbind", "nosuid", "nodev", "noexec", "rw"]},
        *spec.extra_mounts,
        *([_bind(spec.empty_file, "/etc/ld.so.preload", readonly=True)]
          if spec.empty_file else []),
        *([_bind(spec.resolv_file, "/etc/resolv.conf", readonly=True)]
          if spec.resolv_file else []),
    ]


def _resources(limits: Limits) -> dict[str, Any]:
    memory = limits.memory_mb * 1024 * 1024
    period = 100_000
    return {
        "devices": [{"allow": False, "access": "rwm"}],
        # swap == limit: no swap beyond the memory limit.
        "memory": {"limit": memory, "swap": memory},
        "pids": {"limit": limits.pids},
        "cpu": {"quota": int(limits.cpu * period), "period": period, "shares": 1024},
    }


def _nofile() -> int:
    # Raising past our own hard limit needs privileges the sandbox's userns lacks.
    return min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])


def build_config(spec: BundleSpec) -> dict[str, Any]:
    """The root engine's container: one shared unprivileged id range, cgroupfs limits."""
    id_map = [{"containerID": 0, "hostID": HOST_ID_BASE, "size": HOST_ID_COUNT}]
    # cgroup: the sandbox sees its own cgroup as /, not the host's hierarchy and path.
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount", "user", "network",
                                        "cgroup")]
    config: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            # Imported, not run as a script, so its precompiled bytecode is used.
            # -X utf8 and LC_ALL=C: no locale files read from the sandbox's /usr.
            "args": [*spec.python, "-I", "-S", "-X", "utf8", "-c", _GUEST_BOOT,
                     "--listen-fd", str(GUEST_LISTEN_FD)],
            "env": [f"PATH={DEFAULT_PATH}", "HOME=/root", "LC_ALL=C"],
            "cwd": "/",
            "capabilities": {k: CAPABILITIES for k in
                             ("bounding", "effective", "permitted")},
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": _nofile(), "soft": _nofile()},
                {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
                    ],
            "noNewPrivileges": True,
            "oomScoreAdj": 0,
        },
        "root": {"path": spec.rootfs, "readonly": False},
        "hostname": spec.sandbox_id,
        "mounts": _mounts(spec),
        "linux": {
            "uidMappings": id_map,
            "gidMappings": [dict(m) for m in id_map],
            "namespaces": namespaces,
            "cgroupsPath": f"/abx/{spec.sandbox_id}",
            "resources": _resources(spec.limits),
            "seccomp": seccomp_profile(),
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
        },
    }
    return config


def to_rootless(config: dict[str, Any], user: UserHost) -> dict[str, Any]:
    """The same container for an engine running as an ordinary user: a new config, the
    root one untouched (as runc's ``ToRootless`` and containerd's spec options do)."""
    out = copy.deepcopy(config)
    process, linux = out["process"], out["linux"]
    linux["uidMappings"], linux["gidMappings"] = copy.deepcopy(user.id_map)
    out["mounts"] = [*copy.deepcopy(user.rootfs_mounts), *out["mounts"]]
    process["rlimits"] += copy.deepcopy(user.rlimits)
    process.pop("oomScoreAdj", None)  # a user may not lower its own score
    if user.cgroups == "systemd":  # runc --systemd-cgroup: slice:prefix:name
        linux["cgroupsPath"] = f"user.slice:abx:{out['hostname']}"
        del linux["resources"]["devices"]  # a user's runc cannot program the device cgroup
    else:
        del linux["cgroupsPath"], linux["resources"]  # nothing a plain user may write
    return out
