"""One sandbox's lifecycle lock, across threads and across engine processes.

An ``RLock`` orders this process's threads; its outermost holder also takes an exclusive
``flock`` on ``<sandbox dir>/lock`` (host-only), so two processes sharing a data dir (an
MCP server, the CLI, a gateway) never boot, pause, reset or kill one sandbox at the same
time. A process that waits longer than ``WAIT`` gets a clear "busy" error; a process that
dies releases its flock with its descriptors, so a crash never leaves a sandbox locked.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from types import TracebackType

from agent_sandbox.core.errors import WrongStateError

WAIT = 60.0
_POLL = 0.01
LOCK_FILE = "lock"


class SandboxLock:
    def __init__(self, sandbox_id: str, folder: Path) -> None:
        self._id = sandbox_id
        self._path = folder / LOCK_FILE
        self._rlock = threading.RLock()
        self._depth = 0  # guarded by _rlock
        self._fd: int | None = None

    def __enter__(self) -> SandboxLock:
        self._rlock.acquire()
        if self._depth == 0:
            try:
                self._fd = _flock(self._path, self._id)
            except BaseException:
                self._rlock.release()
                raise
        self._depth += 1
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None
        self._rlock.release()


def _flock(path: Path, sandbox_id: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        return None  # no sandbox dir (gone, or never made): nothing on disk to guard
    deadline = time.monotonic() + WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise WrongStateError(
                    f"sandbox {sandbox_id} is busy: another process has been changing it "
                    f"for over {WAIT:.0f} s; try again") from None
            time.sleep(_POLL)


def held_elsewhere(lock_file: Path) -> bool:
    """Whether another process holds an exclusive flock on ``lock_file`` (recovery asks
    it of a sandbox's lifecycle lock and of its create lock)."""
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the probe's lock
    return False
