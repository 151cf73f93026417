"""Errors the guest reports to its client, and how OS errors map onto them (stdlib only)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional


class GuestError(Exception):
    """An error reported to the client as ``{"done": true, "error": {...}}``."""

    def __init__(self, code: str, message: str, details: Optional[Dict[str, Any]] = None
                 ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


def bad(message: str) -> GuestError:
    return GuestError("invalid_argument", message)


def file_kind(mode: int) -> str:
    """What a non-regular file is, for error messages."""
    import stat

    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def os_error(exc: OSError, what: str) -> GuestError:
    """Map an OSError to a wire error with a message naming the path or program."""
    import errno

    reason = exc.strerror or str(exc)
    if isinstance(exc, FileNotFoundError):
        return GuestError("not_found", f"{what}: no such file or directory")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        return GuestError("resource_exhausted", f"{what}: {reason}")
    if isinstance(
        exc, (PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
    ) or exc.errno in (
        errno.ENOTEMPTY,
        errno.EINVAL,
        errno.EXDEV,
        errno.ELOOP,
        errno.ENAMETOOLONG,
        errno.EBUSY,
        errno.ENXIO,  # a device with nothing behind it (/dev/tty without a terminal)
        errno.EROFS,
        errno.ETXTBSY,
    ):
        return bad(f"{what}: {reason}")
    return GuestError("internal", f"{what}: {reason}")
