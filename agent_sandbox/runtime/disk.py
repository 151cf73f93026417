"""Per-sandbox disks: a sparse ext4 image, loop-mounted, holding the sandbox's system
layer (overlay upper dirs) and its /workspace volume.

A full image answers ENOSPC inside the sandbox while the host only ever gives it
``size_mb``; this kernel has no quota support, so a filesystem per sandbox is the limit.
The image *is* the volume: kept after kill, it can be attached to a new sandbox.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from agent_sandbox.errors import ResourceExhaustedError, RuntimeUnavailableError
from agent_sandbox.runtime import syscalls
from agent_sandbox.runtime.config import HOST_ID_BASE

WORKSPACE = "workspace"
SYSTEM = "sys"


def _formatted_blank(cache_dir: Path, size_mb: int) -> Path:
    """A freshly formatted image of this size, made once and copied sparsely after."""
    blank = cache_dir / f"blank-{size_mb}m.img"
    if blank.exists():
        return blank
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = blank.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.truncate(size_mb * 1024 * 1024)
    # No journal: the data is scratch space, and it keeps the image tiny until written.
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-m", "0",
         "-E", f"lazy_itable_init=1,root_owner={HOST_ID_BASE}:{HOST_ID_BASE}", str(tmp)],
        check=True, capture_output=True,
    )
    os.replace(tmp, blank)
    return blank


def create_image(image: Path, size_mb: int, cache_dir: Path, reserve_mb: int) -> None:
    free_mb = shutil.disk_usage(image.parent).free // (1024 * 1024)
    if free_mb < reserve_mb + 64:
        raise ResourceExhaustedError(
            f"host disk nearly full ({free_mb} MB free, {reserve_mb} MB kept in reserve); "
            "delete sandboxes or volumes, or free space on the host"
        )
    blank = _formatted_blank(cache_dir, size_mb)
    subprocess.run(["cp", "--sparse=always", str(blank), str(image)], check=True)


def attach(image: Path, mountpoint: Path) -> None:
    """Loop-mount the image and make sure its two top directories exist."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(mountpoint):
        proc = subprocess.run(
            ["mount", "-o", "loop,nodev,noatime", str(image), str(mountpoint)],
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise RuntimeUnavailableError(f"cannot mount sandbox disk {image}: "
                                          f"{proc.stderr.strip()}")
    for name in (WORKSPACE, SYSTEM):
        path = mountpoint / name
        if not path.exists():
            path.mkdir()
            os.chown(path, HOST_ID_BASE, HOST_ID_BASE)


def detach(mountpoint: Path) -> None:
    if os.path.ismount(mountpoint):
        try:
            syscalls.umount(str(mountpoint))
        except OSError:
            # Busy (a straggling process): detach lazily; the loop device is freed later.
            syscalls.umount(str(mountpoint), lazy=True)
