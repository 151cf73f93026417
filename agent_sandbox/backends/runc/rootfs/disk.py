"""Per-sandbox disks: an ext4 image, loop-mounted, holding the sandbox's system layer
(overlay upper dirs) and its /workspace volume.

A full image answers ENOSPC inside the sandbox while the host only ever gives it
``size_mb``; this kernel has no quota support, so a filesystem per sandbox is the limit.
The image *is* the volume: kept after kill, it can be attached to a new sandbox.

Every block of a mounted image is allocated on the host first (fallocate: milliseconds,
no zeros written) and only while the host keeps its reserve after it: a sparse image
would let the sandboxes' limits add up past the host's free space, and a write the
sandbox saw succeed could then fail in the loop device and vanish. A kept volume gives
its unused blocks back when detached (FITRIM) and takes them again when attached.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import struct
import subprocess
import tempfile
import threading
from pathlib import Path

from agent_sandbox.backends.runc.host import syscalls
from agent_sandbox.config.engine import HOST_ID_BASE
from agent_sandbox.core.errors import ResourceExhaustedError, RuntimeUnavailableError

_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOATIME = 1024
_FITRIM = 0xC0185879  # _IOWR('X', 121, struct fstrim_range)

WORKSPACE = "workspace"
SYSTEM = "sys"


_blank_guard = threading.Lock()
_sound_blanks: set[Path] = set()
# Blanks kept (the most recently used sizes): each distinct disk_mb asked for makes one,
# and a client choosing a new size every time must not fill the host with them.
_KEPT_BLANKS = 8


def _formatted_blank(cache_dir: Path, size_mb: int) -> Path:
    """A freshly formatted image of this size, made once and copied sparsely after."""
    blank = cache_dir / f"blank-{size_mb}m.img"
    with _blank_guard:
        # Another engine process may have evicted it since (never while we copy: the
        # caller holds the cache's shared lock).
        if blank in _sound_blanks and blank.exists():
            return blank
        _sound_blanks.discard(blank)
        # Checked once per process (~12 ms): older engines could cache a corrupt blank (two
        # threads made it in one temp file), failing every create after; it is made again.
        if blank.exists() and subprocess.run(["e2fsck", "-fn", str(blank)],
                                             capture_output=True).returncode != 0:
            blank.unlink(missing_ok=True)
        if not blank.exists():
            _make_blank(blank, size_mb)
        _sound_blanks.add(blank)
        return blank


def _make_blank(blank: Path, size_mb: int) -> None:
    cache_dir = blank.parent
    cache_dir.mkdir(parents=True, exist_ok=True)
    # A name of its own per call: threads of one engine (a create and the warm pool's
    # refill) race here, and a shared name let one truncate the other's half-made image,
    # caching a corrupt blank ("Structure needs cleaning" on every mount after).
    _sweep_dead_temps(cache_dir)
    fd, name = tempfile.mkstemp(prefix=f"{blank.name}.{os.getpid()}.", suffix=".tmp",
                                dir=cache_dir)
    tmp = Path(name)
    with os.fdopen(fd, "wb") as fh:
        fh.truncate(size_mb * 1024 * 1024)
    try:
        # No journal: the data is scratch space, and it keeps the image tiny until written.
        _run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-m", "0",
              "-E", f"lazy_itable_init=1,root_owner={HOST_ID_BASE}:{HOST_ID_BASE}", str(tmp)])
        os.replace(tmp, blank)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _sweep_dead_temps(cache_dir: Path) -> None:
    """Half-made blanks of processes killed while formatting (``<blank>.<pid>.*.tmp``)."""
    for tmp in cache_dir.glob("blank-*.img.*.tmp"):
        pid = tmp.name.split(".")[2]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except (PermissionError, OverflowError):
            continue


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        why = " ".join((proc.stderr or proc.stdout).split())[-400:] or f"exit {proc.returncode}"
        raise RuntimeUnavailableError(f"making a sandbox disk failed ({argv[0]}): {why}")


def _refuse(free: int, need_mb: int, reserve_mb: int, what: str) -> ResourceExhaustedError:
    return ResourceExhaustedError(
        f"host disk too full for {what} of {need_mb} MB: {free >> 20} MB free, "
        f"{reserve_mb} MB kept in reserve for the engine; ask for a smaller disk_mb, "
        "delete sandboxes, snapshots or kept volumes, or free space on the host")


def has_room(folder: Path, reserve_mb: int, need_mb: int) -> bool:
    """Whether ``need_mb`` more would leave the host filesystem its reserve."""
    return shutil.disk_usage(folder).free >= (reserve_mb + need_mb) << 20


def check_free(folder: Path, reserve_mb: int, need_mb: int = 64,
               what: str = "a sandbox disk") -> None:
    """Refuse what would leave the host filesystem with less than the reserve."""
    if not has_room(folder, reserve_mb, need_mb):
        raise _refuse(shutil.disk_usage(folder).free, need_mb, reserve_mb, what)


def create_image(image: Path, size_mb: int, cache_dir: Path, reserve_mb: int) -> None:
    check_free(image.parent, reserve_mb, size_mb)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # no blank is evicted while it is copied
        blank = _formatted_blank(cache_dir, size_mb)
        _run(["cp", "--sparse=always", str(blank), str(image)])
        os.utime(blank)
    _evict_blanks(cache_dir)


def _evict_blanks(cache_dir: Path) -> None:
    """Remove all but the most recently used blanks (skipped while one is being copied)."""
    blanks = sorted(cache_dir.glob("blank-*.img"), key=lambda p: p.stat().st_mtime)
    if len(blanks) <= _KEPT_BLANKS:
        return
    with open(cache_dir / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        with _blank_guard:
            for old in blanks[:-_KEPT_BLANKS]:
                old.unlink(missing_ok=True)
                _sound_blanks.discard(old)


def _allocate(image: Path, reserve_mb: int) -> None:
    """Give every block of the image host storage, or refuse while nothing is taken.

    Serialized across engines by a lock beside the images, so two admissions cannot both
    count the same free space.
    """
    with open(image.parent / ".allocate.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fd = os.open(image, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            missing = max(0, st.st_size - st.st_blocks * 512)
            if missing == 0:
                return
            free = shutil.disk_usage(image.parent).free
            if free - missing < reserve_mb << 20:
                raise _refuse(free, st.st_size >> 20, reserve_mb)
            try:
                syscalls.fallocate(fd, st.st_size)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise _refuse(shutil.disk_usage(image.parent).free, st.st_size >> 20,
                                  reserve_mb) from exc
                if exc.errno != errno.EOPNOTSUPP:  # such a filesystem: the check above
                    raise
        finally:
            os.close(fd)


def trim(mountpoint: Path) -> None:
    """Hand the host back every block the mounted image does not use (the loop device
    turns the discards into holes in the image): a kept volume costs only its data."""
    if not os.path.ismount(mountpoint):
        return
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _FITRIM, struct.pack("=QQQ", 0, (1 << 64) - 1, 0))
    except OSError:
        pass  # no discard support: the volume keeps its blocks, nothing is lost
    finally:
        os.close(fd)


def _mount_via_loop(image: Path, mountpoint: Path) -> None:
    """Bind the image to a free loop device (freed by itself on the last unmount) and
    mount it. Done with ioctls rather than ``mount -o loop``, the slowest step of a cold
    create otherwise; the device fd stays open until mounted, or autoclear frees it.
    """
    flags = os.O_RDWR | os.O_CLOEXEC
    # Opened through a detached mount: sysfs shows every sandbox the backing file as
    # /<image name>, not the host's data dir (the loop's own name for it, the full path,
    # is only for whoever may open the device: the host's root).
    backing = syscalls.open_detached(str(image), os.O_RDWR)
    try:
        ctl = os.open("/dev/loop-control", flags)
        try:
            for _ in range(16):
                number = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
                device = f"/dev/loop{number}"
                dev_fd = os.open(device, flags)
                try:
                    config = struct.pack("=II", backing, 0) + _loop_info(image) + bytes(64)
                    fcntl.ioctl(dev_fd, _LOOP_CONFIGURE, config)
                    syscalls.mount(device, str(mountpoint), "ext4",
                                   _MS_NOSUID | _MS_NODEV | _MS_NOATIME)
                    return
                except OSError as exc:
                    if exc.errno != errno.EBUSY:  # another process took it: try the next
                        raise
                finally:
                    os.close(dev_fd)
        finally:
            os.close(ctl)
    finally:
        os.close(backing)
    raise RuntimeUnavailableError("no free loop device for the sandbox disk")


def _loop_info(image: Path) -> bytes:
    # struct loop_info64: 5 x u64, 4 x u32, file name[64], crypt name[64], key[32], 2 x u64
    name = str(image).encode()[:63]
    return struct.pack("=QQQQQIIII64s64s32sQQ", 0, 0, 0, 0, 0, 0, 0, 0, _LO_FLAGS_AUTOCLEAR,
                       name, b"", b"", 0, 0)


def attach(image: Path, mountpoint: Path, reserve_mb: int) -> None:
    """Mount the image, its blocks allocated first, and make sure its two top
    directories exist."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(mountpoint):
        _allocate(image, reserve_mb)
        try:
            _mount_via_loop(image, mountpoint)
        except OSError as exc:
            raise RuntimeUnavailableError(f"cannot mount sandbox disk {image}: {exc}") from exc
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
