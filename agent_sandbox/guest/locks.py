"""File locks: every write of ours to one path in turn, explicit locks for longer edits,
and file versions for conditional writes (stdlib only).

The table lives in the guest because every writer of ours meets there: the MCP servers,
gateways and SDK scripts of one host, or of several, all reach a sandbox's files through
its guest. A process inside the sandbox does not: it can still write any file it may
(the locks bind our writers only). The table is bounded (locks per holder and per
sandbox, waiting writers) and no wait here outlasts the wait its caller gave.
"""

from __future__ import annotations

import math
import os
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Callable, Dict, Optional, Set

    Req = Dict[str, Any]

if __package__:
    from . import checks, ops
    from .conn import Conn
    from .errors import GuestError, bad
    from .limits import (
        LOCK_TTL_MAX,
        LOCK_WAIT_DEFAULT,
        LOCK_WAIT_MAX,
        LOCK_WAITERS_MAX,
        LOCKS_MAX,
        LOCKS_PER_HOLDER,
        RETRY_AFTER_MAX,
    )
else:  # imported by agent.py from the guest's directory
    import checks  # type: ignore[no-redef]
    import ops  # type: ignore[no-redef]
    from conn import Conn  # type: ignore[no-redef]
    from errors import GuestError, bad  # type: ignore[no-redef]
    from limits import (  # type: ignore[no-redef]
        LOCK_TTL_MAX,
        LOCK_WAIT_DEFAULT,
        LOCK_WAIT_MAX,
        LOCK_WAITERS_MAX,
        LOCKS_MAX,
        LOCKS_PER_HOLDER,
        RETRY_AFTER_MAX,
    )

MAX_HOLDER = 200  # characters of a holder's name (a session id, a key's name)
MAX_TOKEN = 64


def version_of(st: os.stat_result) -> str:
    """A file's version: its device, inode, size and modification time. Cheap for any
    size; our own writes always change it (a new inode, and ``bump_mtime``)."""
    return "%x.%x.%x.%x" % (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def current_version(path: str) -> Optional[str]:
    """The version of the regular file at ``path``; None when there is none."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    import stat

    return version_of(st) if stat.S_ISREG(st.st_mode) else None


def bump_mtime(fd: int, old: Optional[os.stat_result]) -> None:
    """Give the file about to replace ``old`` a later mtime than it: a version seen
    before two quick writes (a reused inode, the same size, one clock tick) cannot match
    again."""
    if old is None:
        return
    st = os.fstat(fd)
    if st.st_mtime_ns <= old.st_mtime_ns:
        os.utime(fd, ns=(st.st_atime_ns, old.st_mtime_ns + 1))


def key_of(path: str) -> str:
    """The table's name for ``path``: one for each spelling of it (``/w//a``, ``/w/./a``,
    a directory reached through a symlink), so no alias passes another's lock."""
    path = os.path.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    directory, name = os.path.split(path)
    try:
        directory = os.path.realpath(directory)
    except (OSError, ValueError):
        pass
    return os.path.join(directory, name)


class Held:
    __slots__ = ("token", "holder", "expires")

    def __init__(self, token: str, holder: str, expires: float) -> None:
        self.token = token
        self.holder = holder
        self.expires = expires


def _retry_after(seconds: float) -> int:
    return max(1, min(RETRY_AFTER_MAX, int(math.ceil(seconds))))


class Locks:
    """The paths being written now and the explicit locks, under one condition."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._cond = threading.Condition()
        self._clock = clock
        self._writing: Set[str] = set()
        self._held: Dict[str, Held] = {}
        self._waiters = 0

    # -- checks of a request's fields
    @staticmethod
    def wait_of(req: Req) -> float:
        value = req.get("lock_wait")
        if value is None:
            return LOCK_WAIT_DEFAULT
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not 0 <= value <= LOCK_WAIT_MAX):  # False for NaN
            raise bad(f"'lock_wait' must be a number of seconds in [0, {LOCK_WAIT_MAX:g}], "
                      f"got {value!r}")
        return float(value)

    @staticmethod
    def token_of(req: Req, required: bool = False) -> Optional[str]:
        value = req.get("lock_token")
        if value is None and not required:
            return None
        if not isinstance(value, str) or not 0 < len(value) <= MAX_TOKEN:
            raise bad(f"'lock_token' must be the token lock_file gave, got {str(value)[:80]!r}")
        return value

    # -- the table
    def _expire(self, now: float) -> None:
        gone = [p for p, h in self._held.items() if h.expires <= now]
        for path in gone:
            del self._held[path]
        if gone:
            self._cond.notify_all()

    def _locked(self, path: str, now: float) -> GuestError:
        held = self._held.get(path)
        if held is None:
            return GuestError("locked", f"{path} is being written by another task; retry "
                              "in a moment", {"path": path, "retry_after": 1})
        left = held.expires - now
        return GuestError(
            "locked", f"{path} is locked by {held.holder} for {left:.0f} s more (the file "
            "is being edited by another task); retry later",
            {"path": path, "holder": held.holder, "expires_in": round(left, 1),
             "retry_after": _retry_after(left)})

    def _take(self, path: str, wait: float, free: Callable[[Optional[Held]], bool]) -> None:
        """Wait (at most ``wait`` s) until no write of ours is under way on ``path`` and
        ``free(its explicit lock)``, then mark it being written."""
        now = self._clock()
        deadline = now + wait
        with self._cond:
            waited = False
            try:
                while True:
                    self._expire(now)
                    if path not in self._writing and free(self._held.get(path)):
                        self._writing.add(path)
                        return
                    if now >= deadline:
                        raise self._locked(path, now)
                    if not waited:
                        if self._waiters >= LOCK_WAITERS_MAX:
                            raise self._locked(path, now)
                        self._waiters += 1
                        waited = True
                    held = self._held.get(path)
                    until = deadline if held is None else min(deadline, held.expires)
                    self._cond.wait(max(0.001, until - now))
                    now = self._clock()
            finally:
                if waited:
                    self._waiters -= 1

    def _done(self, path: str) -> None:
        with self._cond:
            self._writing.discard(path)
            self._cond.notify_all()

    def write(self, given: str, wait: float, token: Optional[str]) -> Writing:
        """The right to write ``path`` now: no other write of ours under way, and no lock
        on it but the one ``token`` names. A ``token`` whose lock is gone (it expired, or
        was released) is a conflict: someone else may have written since."""
        path = key_of(given)

        def free(held: Optional[Held]) -> bool:
            if held is not None:
                return held.token == token
            if token is not None:
                raise _gone(given)
            return True

        self._take(path, wait, free)
        return Writing(self, path)

    def check(self, path: str, token: Optional[str] = None) -> None:
        """Refuse at once (no wait) if another holder's lock is on ``path`` (a remove or
        a rename of it)."""
        path = key_of(path)
        with self._cond:
            now = self._clock()
            self._expire(now)
            held = self._held.get(path)
            if (held is not None and held.token != token) or path in self._writing:
                raise self._locked(path, now)

    def lock(self, path: str, ttl: float, holder: str, wait: float,
             token: Optional[str]) -> Dict[str, Any]:
        """Take (or, with its ``token``, renew) the explicit lock on ``path``."""
        path = key_of(path)

        def free(held: Optional[Held]) -> bool:
            if held is not None:
                return held.token == token
            if token is not None:  # a renewal of a lock that lapsed: others may have written
                raise _gone(path)
            mine = sum(1 for h in self._held.values() if h.holder == holder)
            if mine >= LOCKS_PER_HOLDER:
                raise GuestError("resource_exhausted", f"{holder} holds {mine} file locks, "
                                 f"the most one holder may; unlock some first")
            if len(self._held) >= LOCKS_MAX:
                raise GuestError("resource_exhausted", f"this sandbox has {LOCKS_MAX} file "
                                 "locks, the most it keeps; retry once some are released")
            return True

        self._take(path, wait, free)
        try:
            with self._cond:
                now = self._clock()
                new = token or os.urandom(16).hex()
                self._held[path] = Held(new, holder, now + ttl)
        finally:
            self._done(path)
        return {"token": new, "path": path, "holder": holder, "expires_in": ttl}

    def unlock(self, path: str, token: str) -> None:
        path = key_of(path)
        with self._cond:
            self._expire(self._clock())
            held = self._held.get(path)
            if held is None or held.token != token:
                raise GuestError("not_found", f"{path} has no lock with that token (it "
                                 "expired, was released, or is another holder's)")
            del self._held[path]
            self._cond.notify_all()

    def unlock_holder(self, holder: str) -> int:
        with self._cond:
            mine = [p for p, h in self._held.items() if h.holder == holder]
            for path in mine:
                del self._held[path]
            self._cond.notify_all()
            return len(mine)

    def held(self, holder: Optional[str] = None) -> int:
        with self._cond:
            self._expire(self._clock())
            return sum(1 for h in self._held.values() if holder in (None, h.holder))


def _gone(given: str) -> GuestError:
    return GuestError(
        "conflict", f"the lock on {given} that lock_token names is gone (it expired or "
        "was released); lock the file again (without the old token) and re-read it",
        {"path": given, "current_version": current_version(given)})


class Writing:
    """A write of ``path`` under way; ``done()`` lets the next one in."""

    def __init__(self, locks: Locks, path: str) -> None:
        self._locks = locks
        self.path = path

    def __enter__(self) -> Writing:
        return self

    def __exit__(self, *exc: object) -> None:
        self._locks._done(self.path)


TABLE = Locks()


def check_match(req: Req, path: str) -> None:
    """A conditional write (``if_match``) of a file no longer at that version fails."""
    want = req.get("if_match")
    if want is None:
        return
    if not isinstance(want, str) or not 0 < len(want) <= 100:
        raise bad(f"'if_match' must be a version a read or a listing gave, got "
                  f"{str(want)[:80]!r}")
    now = current_version(path)
    if now != want:
        what = "no longer exists" if now is None else "has changed since that version"
        raise GuestError("conflict", f"{path} {what} (if_match {want}); read it again "
                         "and redo the change", {"path": path, "current_version": now})


def _holder(req: Req) -> str:
    value = req.get("holder")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_HOLDER:
        raise bad(f"'holder' must be a name of at most {MAX_HOLDER} characters")
    return value


def op_lock(conn: Conn, req: Req) -> None:
    path = checks.path(req)
    ttl = req.get("ttl")
    if (isinstance(ttl, bool) or not isinstance(ttl, (int, float))
            or not 0 < ttl <= LOCK_TTL_MAX):
        raise bad(f"'ttl' must be a number of seconds in (0, {LOCK_TTL_MAX:g}], got {ttl!r}")
    conn.done(**TABLE.lock(path, float(ttl), _holder(req), Locks.wait_of(req),
                           Locks.token_of(req)))


def op_unlock(conn: Conn, req: Req) -> None:
    if req.get("holder") is not None and req.get("path") is None:
        conn.done(released=TABLE.unlock_holder(_holder(req)))
        return
    TABLE.unlock(checks.path(req), str(Locks.token_of(req, required=True)))
    conn.done(released=1)


HANDLERS: Dict[str, Callable[[Conn, Req], None]] = {
    ops.LOCK: op_lock,
    ops.UNLOCK: op_unlock,
}
