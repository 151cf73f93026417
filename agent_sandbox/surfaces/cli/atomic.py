"""Atomic file replacement: temp file in the same directory, fsync, rename."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600, force_mode: bool = False) -> None:
    """Replace ``path`` with ``data``. An existing file keeps its mode (and owner, when we
    may set it) unless ``force_mode``; a new one gets ``mode``."""
    path = Path(path)
    try:
        st: os.stat_result | None = path.stat()
    except FileNotFoundError:
        st = None
    final_mode = mode if (st is None or force_mode) else (st.st_mode & 0o7777)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), final_mode)
            if st is not None:
                with contextlib.suppress(OSError):
                    os.fchown(fh.fileno(), st.st_uid, st.st_gid)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def backup(path: Path) -> Path | None:
    """Copy ``path`` to ``<name>.abx-backup`` (same mode) before we change it."""
    if not path.exists():
        return None
    dest = path.with_name(path.name + ".abx-backup")
    atomic_write(dest, path.read_bytes(), mode=path.stat().st_mode & 0o7777, force_mode=True)
    shutil.copystat(path, dest, follow_symlinks=True)
    return dest
