"""A sandbox's resource use read on the host: CPU time and memory from its cgroup (v2, or
v1's cpuacct and memory hierarchies), disk from the filesystem of its disk. Every file read
is the kernel's (cgroupfs, procfs), never one the sandbox could write, and each read is
bounded."""

from __future__ import annotations

import math
import os
from pathlib import Path

from agent_sandbox.core.errors import RuntimeUnavailableError
from agent_sandbox.core.metrics import Usage

CGROUP_ROOT = Path("/sys/fs/cgroup")
_MAX_READ = 1 << 16  # bytes of a cgroup or proc file (memory.stat is ~1-2 KiB)


def _read(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return os.read(fd, _MAX_READ).decode("ascii", "replace")
    finally:
        os.close(fd)


def _number(path: Path) -> int | None:
    """An integer file's value; None for ``max`` (no limit) or a file that is not there."""
    try:
        text = _read(path).strip()
    except OSError:
        return None
    return int(text) if text.isascii() and text.isdigit() and len(text) < 40 else None


def _stat_field(path: Path, *names: str) -> int:
    try:
        lines = _read(path).splitlines()
    except OSError:
        return 0
    found = dict(line.split(" ", 1) for line in lines if line.count(" ") == 1)
    for name in names:
        value = found.get(name, "").strip()
        if value.isascii() and value.isdigit() and len(value) < 40:
            return int(value)
    return 0


def cgroup_of_pid(pid: int) -> str | None:
    """The cgroup (v2's unified path, else v1's memory one) a host process is in."""
    try:
        lines = _read(Path(f"/proc/{int(pid)}/cgroup")).splitlines()
    except OSError:
        return None
    by_controller = {}
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        for name in controllers.split(","):
            by_controller[name] = path
    return by_controller.get("memory") or by_controller.get("")


def host_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def read(cgroup: str, cpus: float | None, disk: Path | None) -> Usage:
    """``cgroup``: its path under the hierarchy's root (``/abx/sbx-...``); ``cpus``: its CPU
    limit (None: the host's); ``disk``: a directory on its disk (None: no disk of its own)."""
    rel = cgroup.strip("/")
    if ".." in rel.split("/"):
        raise RuntimeUnavailableError(f"cgroup path {cgroup!r} is not under {CGROUP_ROOT}")
    unified = (CGROUP_ROOT / "cgroup.controllers").exists()
    if unified:
        base = CGROUP_ROOT / rel
        cpu_usec = _stat_field(base / "cpu.stat", "usage_usec")
        cpu_seconds = cpu_usec / 1e6
        mem_used = _number(base / "memory.current")
        mem_cache = _stat_field(base / "memory.stat", "file")
        mem_limit = _number(base / "memory.max")
    else:
        memory = CGROUP_ROOT / "memory" / rel
        cpu_ns = _number(CGROUP_ROOT / "cpuacct" / rel / "cpuacct.usage")
        cpu_seconds = (cpu_ns or 0) / 1e9
        mem_used = _number(memory / "memory.usage_in_bytes")
        mem_cache = _stat_field(memory / "memory.stat", "total_cache", "cache")
        mem_limit = _number(memory / "memory.limit_in_bytes")
    if mem_used is None:
        raise RuntimeUnavailableError(
            f"no memory cgroup to read at {rel!r}: metrics need the sandbox's cgroup "
            "(cgroup v2, or v1's memory and cpuacct controllers; see `abx doctor`)")
    memory_total = host_memory()
    if mem_limit is not None and 0 < mem_limit < memory_total:
        memory_total = mem_limit
    disk_used = disk_total = 0
    if disk is not None:
        disk_used, disk_total = _disk(disk)
    return Usage(cpu_seconds=cpu_seconds,
                 cpu_count=max(1, math.ceil(cpus or os.cpu_count() or 1)),
                 mem_used=mem_used, mem_cache=min(mem_cache, mem_used),
                 mem_total=memory_total, disk_used=disk_used, disk_total=disk_total)


def _disk(where: Path) -> tuple[int, int]:
    """(used, total) bytes of the filesystem ``where`` is on; opened O_PATH|O_NOFOLLOW: a
    host directory, but never followed through a link."""
    try:
        fd = os.open(where, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0, 0
    try:
        st = os.fstatvfs(fd)
    finally:
        os.close(fd)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize
