"""Giving what the guest just made to an account (stdlib only, Python >= 3.9).

Always through a descriptor of the thing made, never by its name alone: a sandbox process
may swap the name meanwhile (for a symlink, or a hard link to one of root's files), and
what it put there is then never followed, nor given away unless it is what was made."""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of the guest's startup
    from typing import Optional, Tuple

    Owner = Tuple[int, int]  # uid, gid

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def give_dir(path: str, owner: Owner, dir_fd: Optional[int] = None) -> None:
    """The directory ``path`` (relative to ``dir_fd``) to ``owner``; a symlink or a file
    there now is an OSError (ELOOP, ENOTDIR), not followed."""
    fd = os.open(path, _DIR, dir_fd=dir_fd)
    try:
        os.fchown(fd, *owner)
    finally:
        os.close(fd)


def give_link(parent: int, name: str, owner: Owner) -> None:
    """The symlink ``name`` in ``parent`` to ``owner``, if it is still a symlink: opened
    without following it and changed through /proc/self/fd, which changes the link
    itself (as fchownat with AT_EMPTY_PATH). A link's owner hardly matters: where this
    fails, it stays as it was made."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            os.chown(f"/proc/self/fd/{fd}", *owner)
    except OSError:
        pass
    finally:
        os.close(fd)


def of_regular_file(parent: int, name: str) -> Optional[Owner]:
    """Who owns the regular file ``name`` in ``parent`` (None: not there, or not one):
    whom a file replacing it should belong to."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return (st.st_uid, st.st_gid) if stat.S_ISREG(st.st_mode) else None
