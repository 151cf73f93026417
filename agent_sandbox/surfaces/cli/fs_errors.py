"""Turning a failed file operation into a message that says what to do (never a
traceback, never advice that does not fit: most failures are not about root)."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from agent_sandbox.surfaces.cli.output import CliError

_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def _home() -> Path | None:
    home = os.environ.get("HOME") or os.path.expanduser("~")
    return Path(home) if home and home != "~" else None


def _under(path: Path, folder: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(folder))
    except ValueError:
        return False
    return True


def under_home(path: Path | str) -> bool:
    home = _home()
    return home is not None and _under(Path(path), home)


def describe(exc: OSError, path: Path | str | None = None, *, instead: str = "",
             action: str = "cannot write ") -> str:
    """``cannot write X: reason``, then the fix that fits where X is and why it failed.
    ``instead`` names a way around the file ("set ABX_... to ...")."""
    target = Path(path or exc.filename or "")
    reason = exc.strerror or str(exc)
    text = f"{action}{target}: {reason}" if str(target) not in ("", ".") else reason
    home = _home()
    fixes = []
    if home is not None and _under(target, home):
        if exc.errno in _DENIED or exc.errno in (errno.ENOTDIR, errno.ENOENT):
            text += f" (HOME={home} is not writable by uid {os.geteuid()})"
            fixes.append("point HOME at a directory you can write")
    elif exc.errno in _DENIED:
        fixes.append(f"give uid {os.geteuid()} write access there (owner or mode), or "
                     "use another location")
    elif exc.errno == errno.ENOSPC:
        fixes.append("free some space on that filesystem")
    if instead:
        fixes.append(instead)
    return text + (". Fix: " + "; or ".join(fixes) if fixes else "")


@contextlib.contextmanager
def writing(path: Path | str, *, instead: str = "") -> Iterator[None]:
    """Writes inside the block that fail become one ``CliError`` about ``path``."""
    try:
        yield
    except OSError as exc:
        raise CliError(describe(exc, exc.filename or path, instead=instead)) from None
