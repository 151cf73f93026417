"""Explicit file locks (issue 29): taken, renewed and released in the sandbox's guest,
where every writer of ours meets (``guest/locks.py``). The service checks the inputs and
names the holder; the guest keeps the table, bounded per holder and per sandbox."""

from __future__ import annotations

import os
import socket

from agent_sandbox.core import validate
from agent_sandbox.core.bounds import MAX_LOCK_TOKEN
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.models import FileLock
from agent_sandbox.guestlink.client import GuestProtocolError, field
from agent_sandbox.service.access import GuestAccess

MAX_HOLDER = 200  # the guest's bound on a holder's name
DEFAULT_LOCK_TTL = 60.0


def default_holder() -> str:
    """Who holds a lock taken without a name: this process, on this host."""
    return f"pid {os.getpid()} on {socket.gethostname()}"[:MAX_HOLDER]


def holder_name(value: object) -> str:
    if value is None:
        return default_holder()
    if not isinstance(value, str) or not 0 < len(value) <= MAX_HOLDER \
            or not value.isprintable():
        raise InvalidArgumentError(f"holder must be a printable name of at most {MAX_HOLDER} "
                                   f"characters, got {str(value)[:80]!r}")
    return value


class FileLocks(GuestAccess):
    """lock_file / unlock_file / release_locks: each one guest call, bounded in time."""

    def lock_file(self, sandbox_id: str, path: str, ttl: float = DEFAULT_LOCK_TTL, *,
                  holder: str | None = None, wait: float | None = None,
                  token: str | None = None) -> FileLock:
        """Lock ``path`` for ``ttl`` seconds (renew it with its ``token``), waiting at most
        ``wait`` s (default 0) for another holder's lock or write to end."""
        path = validate.path(path)
        ttl = validate.lock_ttl(ttl)
        who = holder_name(holder)
        wait = validate.lock_wait(wait) or 0.0
        token = validate.lock_token(token)
        raw = self.call(sandbox_id, lambda g: g.lock(path, ttl, who, wait=wait, token=token))
        return FileLock(path=path, holder=who, expires_in=ttl,
                        token=_token(field(raw, "token", str)))

    def unlock_file(self, sandbox_id: str, path: str, token: str) -> None:
        path = validate.path(path)
        checked = validate.lock_token(token)
        if checked is None:
            raise InvalidArgumentError("token is required: the one lock_file gave")
        self.call(sandbox_id, lambda g: g.unlock(path, checked))

    def release_locks(self, sandbox_id: str, holder: str) -> int:
        """Release every lock ``holder`` has in the sandbox (its session ended)."""
        who = holder_name(holder)
        return int(self.call(sandbox_id, lambda g: g.unlock_holder(who)))


def _token(value: str) -> str:
    if not 0 < len(value) <= MAX_LOCK_TOKEN or not value.isalnum():
        raise GuestProtocolError("the guest sent an invalid lock token")
    return value
