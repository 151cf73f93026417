"""The bounded event queue between a watch and its reader (SDK handle, gateway relay),
and the SDK's ``WatchHandle`` over a real guest's watch (an agent subprocess here)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.models import FilesystemEvent
from agent_sandbox.core.watch import EventQueue
from agent_sandbox.guestlink.client import GuestClient
from agent_sandbox.sdk import watch as sdk_watch
from agent_sandbox.sdk.async_sandbox import AsyncWatchHandle
from agent_sandbox.sdk.watch import WatchHandle

AGENT = Path(__file__).resolve().parents[3] / "agent_sandbox" / "guest" / "agent.py"


def _ev(i: int, path_len: int = 10) -> FilesystemEvent:
    return FilesystemEvent(type="create", path="/" + str(i).rjust(path_len, "x"))


def test_a_full_queue_drops_and_says_how_many_where() -> None:
    q = EventQueue(max_events=10, max_bytes=1 << 20)
    for i in range(25):
        q.put(_ev(i))
    assert len(q) == 10 and q.dropped_total == 15
    assert [e.path for e in q.drain(3)] == [_ev(i).path for i in range(3)]
    q.put(_ev(100))  # still dropped: it takes events again once half empty
    rest = q.drain()
    assert [e.path for e in rest[:7]] == [_ev(i).path for i in range(3, 10)]
    assert rest[7].type == "overflow" and rest[7].dropped == 16 and len(rest) == 8
    assert "16 dropped" in rest[7].message
    q.put(_ev(101))
    assert q.drain() == [_ev(101)]


def test_a_flood_makes_one_overflow_event_per_gap() -> None:
    q = EventQueue(max_events=100, max_bytes=1 << 20)
    taken: list[FilesystemEvent] = []
    for i in range(10_000):
        q.put(_ev(i))
        if i % 3 == 0:  # a reader at a third of the rate
            taken += q.drain(1)
    taken += q.drain()
    overflows = [e for e in taken if e.type == "overflow"]
    assert len(taken) < 3500 and 10 < len(overflows) < 100
    assert sum(e.dropped or 0 for e in overflows) + len(taken) - len(overflows) == 10_000


def test_the_byte_bound_holds_whatever_the_paths() -> None:
    q = EventQueue(max_events=10_000, max_bytes=64 << 10)
    for i in range(1000):
        q.put(_ev(i, path_len=4000))
    assert q.bytes <= 64 << 10 and len(q) < 20


def test_an_uncounted_loss_stays_uncounted_and_the_end_reports_it() -> None:
    q = EventQueue(max_events=2, max_bytes=1 << 20)
    q.put(_ev(1))
    q.put(_ev(2))
    q.put(FilesystemEvent(type="overflow", message="the kernel's queue overflowed"))
    q.put(_ev(3))
    q.finish()
    events = q.drain()
    assert [e.type for e in events] == ["create", "create", "overflow"]
    assert events[-1].dropped is None and "more, uncounted" in events[-1].message
    assert q.finished and q.get(0.01) is None


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestClient]:
    sock = str(tmp_path_factory.mktemp("guest") / "g.sock")
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(AGENT), "--unix", sock],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("abx-guest ready")
    try:
        yield GuestClient(sock)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(5)


def test_handle_iterates_polls_and_stops(client: GuestClient, tmp_path: Path) -> None:
    with WatchHandle(client.watch(str(tmp_path))) as handle:
        assert handle.backend == "inotify" and handle.ended is None
        (tmp_path / "a").write_text("x")
        event = handle.next_event(10)
        assert event is not None and (event.type, event.name) == ("create", "a")
        os.unlink(tmp_path / "a")
        deadline = time.monotonic() + 10
        seen: list[FilesystemEvent] = []
        while not any(e.type == "delete" for e in seen) and time.monotonic() < deadline:
            seen += handle.get_new_events()
            time.sleep(0.02)
        assert any(e.type == "delete" and e.name == "a" for e in seen)
    assert handle.ended == "stopped" and list(handle) == [] and handle.error is None


def test_handle_queue_is_bounded(client: GuestClient, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdk_watch, "MAX_QUEUED_EVENTS", 100)
    with WatchHandle(client.watch(str(tmp_path))) as handle:
        for i in range(3000):
            (tmp_path / f"f{i}").touch()
        (tmp_path / "last").touch()
        deadline = time.monotonic() + 10
        while handle._queue.dropped_total == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(handle._queue) <= 101
        events = handle.get_new_events()
        assert events[-1].type == "overflow" and (events[-1].dropped or 0) > 0


def test_handle_with_a_callback(client: GuestClient, tmp_path: Path) -> None:
    got = threading.Event()
    names: list[str] = []

    def on_event(event: FilesystemEvent) -> None:
        names.append(event.name)
        got.set()

    with WatchHandle(client.watch(str(tmp_path)), on_event) as handle:
        (tmp_path / "b").write_text("")
        assert got.wait(10) and names[0] == "b"
        with pytest.raises(InvalidArgumentError, match="on_event"):
            handle.get_new_events()


def test_async_handle_iterates(client: GuestClient, tmp_path: Path) -> None:
    async def main() -> list[str]:
        handle = AsyncWatchHandle._wrap(WatchHandle(client.watch(str(tmp_path),
                                                                 timeout=1.5)))
        (tmp_path / "c").write_text("")
        names = [event.name async for event in handle]
        assert handle.ended == "timeout"
        await handle.stop()
        return names

    assert "c" in asyncio.run(main())
