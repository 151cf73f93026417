"""The guest's ``watch`` op, end to end through ``GuestClient`` (a real agent subprocess
on this host): inotify and the poller, what each change becomes, and the ends."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _agent import running_guest

from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError, ResourceExhaustedError
from agent_sandbox.core.models import FilesystemEvent
from agent_sandbox.guestlink.client import GuestClient
from agent_sandbox.guestlink.watch import GuestWatch

WAIT = 10.0  # generous: events come within a second (bench/watch_latency.py measures)


def _guest(folder: Path) -> Iterator[GuestClient]:
    with running_guest(folder) as guest:
        yield guest


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestClient]:
    yield from _guest(tmp_path_factory.mktemp("guest"))


@pytest.fixture
def own_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestClient]:
    """A guest of the test's own: its watch slots are not the other tests'."""
    yield from _guest(tmp_path_factory.mktemp("guest"))


class Collector:
    """Reads a watch in a thread, so the test can wait for events as they come."""

    def __init__(self, watch: GuestWatch) -> None:
        self.watch = watch
        self.events: list[FilesystemEvent] = []
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self.watch:
                with self._cond:
                    self.events.append(event)
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.error = exc

    def wait_for(self, match: Callable[[FilesystemEvent], bool]) -> FilesystemEvent:
        deadline = time.monotonic() + WAIT
        with self._cond:
            while True:
                for event in self.events:
                    if match(event):
                        return event
                left = deadline - time.monotonic()
                assert left > 0, f"no matching event; got {self.events}"
                self._cond.wait(left)

    def stop(self) -> None:
        self.watch.close()
        self.thread.join(5)
        assert not self.thread.is_alive()


def _is(kind: str, name: str, **more: object) -> Callable[[FilesystemEvent], bool]:
    return lambda e: e.type == kind and e.name == name and all(
        getattr(e, k) == v for k, v in more.items())


@pytest.mark.parametrize("backend", ["inotify", "poll"])
def test_each_change_becomes_its_event(client: GuestClient, tmp_path: Path,
                                       backend: str) -> None:
    root = tmp_path / "w"
    root.mkdir()
    watch = client.watch(str(root), backend=backend)
    assert watch.backend == backend
    seen = Collector(watch)
    try:
        (root / "a.txt").write_text("1")
        seen.wait_for(_is("create", "a.txt", is_dir=False, path=str(root / "a.txt")))
        time.sleep(0.3)  # the poller sees net changes between its looks
        with (root / "a.txt").open("a") as fh:
            fh.write("2")
        seen.wait_for(_is("modify", "a.txt"))
        os.chmod(root / "a.txt", 0o600)
        seen.wait_for(_is("chmod", "a.txt"))
        os.rename(root / "a.txt", root / "b.txt")
        seen.wait_for(_is("rename", "b.txt", old_path=str(root / "a.txt")))
        (root / "d").mkdir()
        seen.wait_for(_is("create", "d", is_dir=True))
        (root / "b.txt").unlink()
        seen.wait_for(_is("delete", "b.txt"))
        (root / "d" / "nested").write_text("not watched: not recursive")
        (root / "last").write_text("")
        seen.wait_for(_is("create", "last"))
        assert not any(e.name.startswith("d/") for e in seen.events)
    finally:
        seen.stop()
    assert seen.error is None and watch.ended == "stopped"


@pytest.mark.parametrize("backend", ["inotify", "poll"])
def test_recursive_follows_new_and_moved_directories(client: GuestClient, tmp_path: Path,
                                                     backend: str) -> None:
    root, outside = tmp_path / "w", tmp_path / "outside"
    (root / "old" / "deep").mkdir(parents=True)
    (outside / "tree").mkdir(parents=True)
    seen = Collector(client.watch(str(root), recursive=True, backend=backend))
    try:
        (root / "old" / "deep" / "f").write_text("x")
        seen.wait_for(_is("create", "old/deep/f"))
        (root / "new" / "a" / "b").mkdir(parents=True)  # made faster than watches are added
        (root / "new" / "a" / "b" / "g").write_text("y")
        seen.wait_for(_is("create", "new/a/b/g"))
        os.rename(root / "old", root / "renamed")
        seen.wait_for(_is("rename", "renamed", is_dir=True, old_path=str(root / "old")))
        (root / "renamed" / "deep" / "h").write_text("z")  # watched under its new name
        seen.wait_for(_is("create", "renamed/deep/h"))
        os.rename(outside / "tree", root / "came")
        seen.wait_for(_is("create", "came", is_dir=True))
        (root / "came" / "i").write_text("in")
        seen.wait_for(_is("create", "came/i"))
        os.rename(root / "renamed", outside / "went")
        seen.wait_for(_is("delete", "renamed", is_dir=True))
        (outside / "went" / "deep" / "j").write_text("no longer ours")
        (root / "end").write_text("")
        seen.wait_for(_is("create", "end"))
        assert not any("j" in e.path.rsplit("/", 1)[-1] for e in seen.events)
        assert not any(e.name.startswith("renamed/") and e.type == "rename"
                       for e in seen.events)  # a directory's move is one event
    finally:
        seen.stop()
    assert seen.error is None


def test_the_watch_ends_with_its_directory_or_its_timeout(client: GuestClient,
                                                          tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    seen = Collector(client.watch(str(root)))
    shutil.rmtree(root)
    seen.thread.join(WAIT)
    assert not seen.thread.is_alive() and seen.error is None
    assert seen.watch.ended == "the watched directory was deleted"
    root.mkdir()
    for backend in ("inotify", "poll"):
        watch = client.watch(str(root), backend=backend, timeout=0.3)
        assert list(watch) == [] and watch.ended == "timeout"


def test_bad_requests_are_refused_before_streaming(client: GuestClient,
                                                   tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(NotFoundError, match="no such file"):
        client.watch(str(tmp_path / "missing"))
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        client.watch(str(tmp_path / "file"))
    with pytest.raises(InvalidArgumentError, match="absolute"):
        client.watch("relative")
    with pytest.raises(InvalidArgumentError, match="backend"):
        client.watch(str(tmp_path), backend="fanotify")


def test_watches_are_bounded_and_closing_one_frees_it(own_client: GuestClient,
                                                      tmp_path: Path) -> None:
    client = own_client
    watches = [client.watch(str(tmp_path)) for _ in range(16)]
    try:
        with pytest.raises(ResourceExhaustedError, match="watched already"):
            client.watch(str(tmp_path))
        watches.pop().close()
        deadline = time.monotonic() + WAIT
        while True:  # the guest notices the close as soon as its reader sees EOF
            try:
                watches.append(client.watch(str(tmp_path)))
                break
            except ResourceExhaustedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        for watch in watches:
            watch.close()


def test_a_flood_overflows_in_the_guest_not_in_the_host(client: GuestClient,
                                                        tmp_path: Path) -> None:
    """Not reading while the sandbox makes 40,000 files: the kernel's queue (16384 events
    by default) overflows inside; the host gets a bounded stream that says so."""
    root = tmp_path / "flood"
    root.mkdir()
    watch = client.watch(str(root))
    try:
        for i in range(40_000):
            (root / f"f{i}").touch()
        seen: list[FilesystemEvent] = []
        stop = threading.Timer(WAIT, watch.close)
        stop.start()
        for event in watch:
            seen.append(event)
            if event.type == "overflow":
                break
        stop.cancel()
        overflow = seen[-1]
        assert overflow.type == "overflow", f"{len(seen)} events, no overflow"
        assert "lost" in overflow.message and overflow.dropped is None
        assert len(seen) < 40_000
    finally:
        watch.close()
