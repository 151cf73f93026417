"""File locks across a sandbox's life (issue 29), on the memory backend (the real guest):
a pause keeps them, a reset of the root filesystem (a new guest) drops them, as
docs/locks.md says; the service's checks of lock input."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from agent_sandbox.core.errors import ConflictError, InvalidArgumentError, LockedError
from agent_sandbox.providers.memory import memory_service
from agent_sandbox.service.service import SandboxService

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bwrap is not installed (apt-get install bubblewrap)")]
F = "/workspace/f"


@pytest.fixture(scope="module")
def service() -> Iterator[SandboxService]:
    svc = memory_service()
    yield svc
    svc.close()


def test_a_pause_keeps_locks_and_a_reset_drops_them(service: SandboxService) -> None:
    sid = service.create().sandbox_id
    try:
        service.write_file(sid, F, b"1")
        lock = service.lock_file(sid, F, 60, holder="editor")
        assert (lock.holder, lock.path, lock.expires_in) == ("editor", F, 60)
        service.pause(sid)
        service.resume(sid)
        with pytest.raises(LockedError, match="locked by editor"):
            service.write_file(sid, F, b"2", lock_wait=0)
        service.reset_rootfs(sid)  # a new guest: no locks
        with pytest.raises(ConflictError, match="expired or was released"):
            service.write_file(sid, F, b"3", lock_token=lock.token)
        service.write_file(sid, F, b"3", lock_wait=0)
    finally:
        service.kill(sid, delete_volume=True)


def test_lock_input_is_checked_before_the_sandbox_is_asked(service: SandboxService) -> None:
    sid = "sbx-0000000000"  # none: every check below comes first
    for call, words in (
            (lambda: service.lock_file(sid, "relative", 5), "absolute"),
            (lambda: service.lock_file(sid, F, 0), "ttl"),
            (lambda: service.lock_file(sid, F, 4000), "an hour"),
            (lambda: service.lock_file(sid, F, 5, holder="x" * 201), "holder"),
            (lambda: service.lock_file(sid, F, 5, wait=31), "lock_wait"),
            (lambda: service.unlock_file(sid, F, ""), "token"),
            (lambda: service.write_file(sid, F, b"", if_match="a\nb"), "if_match"),
            (lambda: service.write_file(sid, F, b"", lock_wait=float("nan")), "lock_wait")):
        with pytest.raises(InvalidArgumentError, match=words):
            call()
