"""File locks and versions in the guest (issue 29): one write of ours to a path at a time,
explicit locks with a TTL, conditional writes, and the table's bounds. A real guest
process on a unix socket, through GuestClient."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _agent import running_guest

from agent_sandbox.core.errors import (
    ConflictError,
    LockedError,
    NotFoundError,
)
from agent_sandbox.guest import locks
from agent_sandbox.guestlink.client import GuestClient


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestClient]:
    with running_guest(tmp_path_factory.mktemp("locks")) as client:
        yield client


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "f.txt")


def _read(guest: GuestClient, path: str) -> tuple[bytes, str | None]:
    stream = guest.read(path)
    version = stream.version  # type: ignore[attr-defined]
    return b"".join(stream), version


def test_reads_listings_and_stat_give_one_version_and_writes_change_it(
        guest: GuestClient, path: str) -> None:
    guest.write(path, b"one")
    data, v1 = _read(guest, path)
    assert data == b"one" and v1
    assert guest.stat(path)["version"] == v1
    assert [e["version"] for e in guest.list(str(Path(path).parent))] == [v1]
    # Same size, same second: still a new version (a new inode and a later mtime).
    guest.write(path, b"two")
    guest.write(path, b"one")
    assert _read(guest, path)[1] != v1
    assert "version" not in guest.stat(str(Path(path).parent))  # directories have none


def test_if_match_writes_only_at_that_version(guest: GuestClient, path: str) -> None:
    guest.write(path, b"base")
    _, v = _read(guest, path)
    guest.write(path, b"theirs")
    with pytest.raises(ConflictError) as err:
        guest.write(path, b"mine", if_match=v)
    now = _read(guest, path)
    assert now[0] == b"theirs"
    assert err.value.details == {"path": path, "current_version": now[1]}
    guest.write(path, b"mine", if_match=now[1])
    assert _read(guest, path)[0] == b"mine"
    with pytest.raises(ConflictError) as gone:
        guest.write(path + ".missing", b"x", if_match=v)
    assert gone.value.details["current_version"] is None


def test_a_write_waits_its_turn_at_most_lock_wait(guest: GuestClient, path: str) -> None:
    started, release = threading.Event(), threading.Event()

    def slow() -> Iterator[bytes]:
        started.set()
        release.wait(10)
        yield b"slow"

    writer = threading.Thread(target=guest.write, args=(path, slow()))
    writer.start()
    try:
        assert started.wait(5)
        t0 = time.monotonic()
        with pytest.raises(LockedError) as err:
            guest.write(path, b"fast", lock_wait=0.3)
        assert 0.25 < time.monotonic() - t0 < 5
        assert err.value.details["path"] == path and err.value.retry_after >= 1
        assert "being written by another task" in err.value.message
    finally:
        release.set()
        writer.join(10)
    guest.write(path, b"fast", lock_wait=0)  # its turn now
    assert _read(guest, path)[0] == b"fast"


def test_explicit_lock_ttl_token_and_holder(guest: GuestClient, path: str) -> None:
    guest.write(path, b"v0")
    held = guest.lock(path, 0.6, "session-a")
    token = held["token"]
    with pytest.raises(LockedError) as err:
        guest.write(path, b"other", lock_wait=0)
    details = err.value.details
    assert details["holder"] == "session-a" and 0 < details["expires_in"] <= 0.6
    assert "locked by session-a" in err.value.message
    with pytest.raises(LockedError):
        guest.remove(path)
    with pytest.raises(LockedError):
        guest.lock(path, 5, "session-b")
    guest.write(path, b"holder", lock_token=token)
    # Another writer that waits long enough gets in once the TTL runs out.
    guest.write(path, b"after ttl", lock_wait=3)
    with pytest.raises(ConflictError, match="expired or was released"):
        guest.write(path, b"late holder", lock_token=token)
    assert _read(guest, path)[0] == b"after ttl"
    with pytest.raises(NotFoundError):
        guest.unlock(path, token)


def test_unlock_and_a_holders_end(guest: GuestClient, tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    token = guest.lock(a, 60, "s1")["token"]
    guest.lock(b, 60, "s1")
    with pytest.raises(NotFoundError):
        guest.unlock(a, "not-the-token")
    guest.unlock(a, token)
    guest.write(a, b"free", lock_wait=0)
    assert guest.unlock_holder("s1") == 1  # b's
    guest.write(b, b"free", lock_wait=0)
    # A renewal with the token keeps the lock; a holder cannot take it twice without.
    token = guest.lock(a, 60, "s2")["token"]
    assert guest.lock(a, 60, "s2", token=token)["token"] == token
    with pytest.raises(LockedError):
        guest.lock(a, 60, "s2")
    assert guest.unlock_holder("s2") == 1


def test_racing_read_modify_write_with_if_match_keeps_every_increment(
        guest: GuestClient, path: str) -> None:
    guest.write(path, b"0")
    per, workers = 15, 4

    def bump() -> None:
        for _ in range(per):
            while True:
                data, v = _read(guest, path)
                try:
                    guest.write(path, str(int(data) + 1).encode(), if_match=v)
                    break
                except (ConflictError, LockedError):
                    continue

    threads = [threading.Thread(target=bump) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert int(_read(guest, path)[0]) == per * workers


def test_the_table_is_bounded_per_holder_and_per_sandbox() -> None:
    table = locks.Locks()
    for i in range(locks.LOCKS_PER_HOLDER):
        table.lock(f"/f{i}", 60, "greedy", 0, None)
    with pytest.raises(locks.GuestError) as err:
        table.lock("/one-more", 60, "greedy", 0, None)
    assert err.value.code == "resource_exhausted"
    for i in range(locks.LOCKS_MAX - locks.LOCKS_PER_HOLDER):
        table.lock(f"/g{i}", 60, f"h{i}", 0, None)
    with pytest.raises(locks.GuestError) as full:
        table.lock("/last", 60, "newcomer", 0, None)
    assert full.value.code == "resource_exhausted"
    assert table.unlock_holder("greedy") == locks.LOCKS_PER_HOLDER
    table.lock("/last", 60, "newcomer", 0, None)


def test_bad_lock_requests_are_refused(guest: GuestClient, path: str) -> None:
    from agent_sandbox.core.errors import InvalidArgumentError

    for ttl in (0, -1, 1e9, float("nan")):
        with pytest.raises(InvalidArgumentError, match="ttl"):
            guest.lock(path, ttl, "s")
    with pytest.raises(InvalidArgumentError, match="holder"):
        guest.lock(path, 5, "x" * 500)
    with pytest.raises(InvalidArgumentError, match="lock_wait"):
        guest.write(path, b"x", lock_wait=1e6)
    with pytest.raises(InvalidArgumentError, match="absolute"):
        guest.lock("relative", 5, "s")


def test_no_other_spelling_of_a_path_passes_its_lock(guest: GuestClient, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to("real")
    path = str(tmp_path / "real" / "f")
    token = guest.lock(path, 30, "s")["token"]
    for other in (str(tmp_path) + "//real/./f", str(tmp_path / "alias" / "f"),
                  str(tmp_path / "real" / ".." / "real" / "f")):
        with pytest.raises(LockedError):
            guest.write(other, b"x", lock_wait=0)
    guest.write(str(tmp_path / "alias" / "f"), b"mine", lock_token=token)
    guest.unlock(str(tmp_path / "real" / "f"), token)


def test_a_lapsed_lock_is_not_renewed(guest: GuestClient, path: str) -> None:
    token = guest.lock(path, 0.2, "s")["token"]
    time.sleep(0.3)
    guest.write(path, b"someone else", lock_wait=0)
    with pytest.raises(ConflictError, match="gone"):
        guest.lock(path, 30, "s", token=token)
    assert guest.lock(path, 30, "s")["token"] != token
    assert guest.unlock_holder("s") == 1


def test_the_guest_keeps_the_cores_bounds() -> None:
    from agent_sandbox.core import bounds
    from agent_sandbox.guest import limits
    from agent_sandbox.guestlink import client
    from agent_sandbox.service import file_locks

    assert (limits.LOCK_WAIT_DEFAULT, limits.LOCK_WAIT_MAX, limits.LOCK_TTL_MAX) == (
        bounds.LOCK_WAIT_DEFAULT, bounds.MAX_LOCK_WAIT, bounds.MAX_LOCK_TTL)
    assert client.LOCK_WAIT_DEFAULT == bounds.LOCK_WAIT_DEFAULT
    assert locks.MAX_TOKEN == bounds.MAX_LOCK_TOKEN and locks.MAX_HOLDER == file_locks.MAX_HOLDER
