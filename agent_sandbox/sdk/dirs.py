"""``files.upload_dir`` and ``files.download_dir``: a directory tree as a tar stream.

The caller's side packs and extracts with the same stdlib code the guest runs
(``agent_sandbox/guest/dir_pack.py`` and ``dir_unpack.py``), one chunk at a time. What a
download brings is made in the sandbox, so it is hostile: it is extracted confined to
``local_dir`` (no absolute or ``..`` names, nothing written through a symlink, no special
permission bits, no owners), up to ``max_bytes`` and ``max_entries``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from typing import Any

from agent_sandbox.core.errors import (
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SandboxError,
)
from agent_sandbox.core.models import DirTransfer
from agent_sandbox.core.provider import Provider
from agent_sandbox.guest.dir_pack import ArchiveError, Notes, pack

DEFAULT_MAX_BYTES = 64 << 30  # archive bytes download_dir takes before it stops
DEFAULT_MAX_ENTRIES = 1_000_000  # files, directories and links
LocalPath = str | os.PathLike[str]


def _local_error(exc: OSError, where: str) -> SandboxError:
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhaustedError(f"{where}: {reason}")
    if isinstance(exc, FileNotFoundError):
        return NotFoundError(f"{where}: no such file or directory")
    return InvalidArgumentError(f"{where}: {reason}")


def _open_dir(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except NotADirectoryError:
        raise InvalidArgumentError(f"{path} is not a directory (files.write and files.read "
                                   "copy one file)") from None
    except OSError as exc:
        raise _local_error(exc, path) from None


def _whole(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgumentError(f"{name} must be a whole number > 0 or None, got {value!r}")
    return value


def upload_dir(provider: Provider, sandbox_id: str, local_dir: LocalPath,
               remote_dir: str, user: str | None = None) -> DirTransfer:
    local = os.fspath(local_dir)
    root = _open_dir(local)
    notes = Notes()
    chunks = pack(root, notes)
    try:
        return provider.write_dir_archive(sandbox_id, remote_dir, chunks, user=user)
    except OSError as exc:  # reading the local tree (an I/O error; unreadable entries are notes)
        raise _local_error(exc, local) from None
    finally:
        chunks.close()
        os.close(root)


def _pull(chunks: Iterator[bytes]) -> bytes:
    for chunk in chunks:
        if chunk:
            return chunk
    return b""


def download_dir(provider: Provider, sandbox_id: str, remote_dir: str, local_dir: LocalPath,
                 *, max_bytes: int | None, max_entries: int | None,
                 outside_links: bool) -> DirTransfer:
    from agent_sandbox.guest.dir_unpack import Unpacker  # imports tarfile: on first use

    max_bytes = _whole(max_bytes, "max_bytes")
    max_entries = _whole(max_entries, "max_entries")
    local = os.fspath(local_dir)
    if os.path.lexists(local) and not os.path.isdir(local):
        raise InvalidArgumentError(f"{local} exists and is not a directory")
    stream = provider.read_dir_archive(sandbox_id, remote_dir)  # a missing one raises here
    chunks = iter(stream)
    try:
        try:
            os.makedirs(local, exist_ok=True)
        except OSError as exc:
            raise _local_error(exc, local) from None
        root = _open_dir(local)
        try:
            unpacker = Unpacker(root, Notes(), max_entries=max_entries,
                                outside_links=outside_links)
            summary = unpacker.run(lambda: _pull(chunks), max_bytes)
        except ArchiveError as exc:
            hint = (" (pass a larger max_bytes or max_entries, or None)" if exc.limit
                    else " (what the sandbox sent cannot be trusted; nothing was written "
                         f"outside {local})")
            cls = InvalidArgumentError if exc.limit else SandboxError
            raise cls(f"download of {remote_dir}: {exc.message}{hint}") from None
        except OSError as exc:
            raise _local_error(exc, local) from None
        finally:
            os.close(root)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    return DirTransfer(files=summary["files"], dirs=summary["dirs"],
                       symlinks=summary["symlinks"], size=summary["bytes"],
                       skipped=summary["skipped"])
