"""Backpressure of a command's streamed output (agent_sandbox/guest/proc.py): a client
that reads slowly makes the program wait instead of the guest buffering for it; one that
stops reading holds it back at most SUB_STALL, then loses its oldest output; a client that
keeps up never loses a byte. In-process on a real child (reaped here, by pid), then
through a real agent subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from _agent import running_guest

from agent_sandbox.guest.limits import SUB_BACKLOG, SUB_STALL
from agent_sandbox.guest.proc import Proc, Subscriber
from agent_sandbox.guest.proc_table import exit_code
from agent_sandbox.guestlink.client import GuestClient


def _seq(n: int) -> bytes:
    """What ``seq 1 n`` prints: every byte's place is known, so a loss shows."""
    return "".join(f"{i}\n" for i in range(1, n + 1)).encode()


class Run:
    """A child whose output is pumped by a Proc, as the guest's table would: the pump and
    a reaper of this one pid run on threads of their own."""

    def __init__(self, script: str, subscribers: int = 1) -> None:
        popen = subprocess.Popen(["/bin/sh", "-c", script], bufsize=0, close_fds=True,
                                 start_new_session=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.finished = threading.Event()
        self.exit_returned: float | None = None  # when the reaper's on_exit came back
        self.proc = Proc(popen, ["/bin/sh", "-c", script], 1 << 20, False,
                         lambda _: self.finished.set())
        self.subs = [self.proc.subscribe(replay=False) for _ in range(subscribers)]
        self.started = time.monotonic()
        threading.Thread(target=self.proc.pump, daemon=True).start()
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        _, status = os.waitpid(self.proc.pid, 0)
        self.proc.on_exit(exit_code(status))
        self.exit_returned = time.monotonic()

    def take(self, sub: Subscriber) -> bytes:
        """What a streaming client (process_ops._stream) does each time it sends."""
        with self.proc.cond:
            chunks = sub.take()
            self.proc.taken()
        return b"".join(data for _, data in chunks)

    def follow(self, sub: Subscriber) -> bytes:
        """A client that keeps up: everything, as it comes, until the end."""
        got = bytearray()
        while True:
            with self.proc.cond:
                while not (sub.chunks or self.proc.finished):
                    self.proc.cond.wait()
                finished = self.proc.finished
            got += self.take(sub)
            if finished:
                return bytes(got)

    def running(self) -> bool:
        return self.proc.exit_code is None

    def close(self) -> None:
        self.proc.signal(signal.SIGKILL)
        self.finished.wait(10)


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        run.close()


def test_a_slow_client_holds_the_program_back_and_loses_nothing(runs: list[Run]) -> None:
    expected = _seq(700_000)  # ~4.8 MB: written in milliseconds by a free-running seq
    run = Run("seq 1 700000")
    runs.append(run)
    sub = run.subs[0]
    got = bytearray()
    held = []
    while not run.finished.is_set() or sub.chunks:
        time.sleep(0.1)  # well within the stall: a slow client, not a stuck one
        held.append((sub.size, run.running()))
        got += run.take(sub)
    assert bytes(got) == expected and not sub.dropped
    assert max(size for size, _ in held) <= SUB_BACKLOG
    assert held[0][1], "seq was not held back: it ended before the client's first read"
    assert len(held) >= len(expected) // SUB_BACKLOG


def test_a_stuck_client_is_dropped_after_the_stall(runs: list[Run]) -> None:
    expected = _seq(1_000_000)  # ~6.9 MB
    run = Run("seq 1 1000000")
    runs.append(run)
    sub = run.subs[0]
    time.sleep(SUB_STALL / 2)
    assert run.running() and not sub.dropped  # waiting for the client, not dropping
    assert SUB_BACKLOG // 2 <= sub.size <= SUB_BACKLOG
    assert run.finished.wait(SUB_STALL + 10), "a stuck client froze the program"
    assert time.monotonic() - run.started >= SUB_STALL * 0.9
    assert sub.dropped and 0 < sub.size <= SUB_BACKLOG
    kept = b"".join(data for _, data in sub.chunks)
    assert expected.endswith(kept)  # the newest output is what a stuck client keeps
    assert run.proc.exit_code == 0
    assert expected.endswith(bytes(run.proc.buffers["stdout"]))  # its tail, as ever


def test_a_client_that_keeps_up_loses_nothing_beside_a_stuck_one(runs: list[Run]) -> None:
    expected = _seq(2_000_000)  # ~14.9 MB
    run = Run("seq 1 2000000", subscribers=2)
    runs.append(run)
    fast, stuck = run.subs
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(run.follow(fast)), daemon=True)
    reader.start()
    reader.join(SUB_STALL + 30)
    assert got and got[0] == expected and not fast.dropped
    assert stuck.dropped and stuck.size <= SUB_BACKLOG


@pytest.mark.parametrize("how", ["cancel", "unsubscribe"])
def test_a_client_gone_releases_the_program_at_once(runs: list[Run], how: str) -> None:
    run = Run("seq 1 1000000")
    runs.append(run)
    sub = run.subs[0]
    time.sleep(0.3)
    assert run.running() and sub.size >= SUB_BACKLOG // 2
    gone = time.monotonic()
    getattr(run.proc, how)(sub)
    assert run.finished.wait(SUB_STALL + 10)
    assert time.monotonic() - gone < SUB_STALL / 2  # not the stall: at once
    assert run.proc.exit_code == 0


def test_the_exit_of_a_held_back_program_is_never_held_up(runs: list[Run]) -> None:
    run = Run("seq 1 1000000")
    runs.append(run)
    time.sleep(0.3)
    assert run.running()  # its pump waits for the client
    killed = time.monotonic()
    assert run.proc.signal(signal.SIGKILL)
    assert run.finished.wait(SUB_STALL + 10)
    assert run.exit_returned is not None and run.exit_returned - killed < SUB_STALL / 2
    assert time.monotonic() - killed < SUB_STALL / 2
    assert run.proc.exit_code == 128 + signal.SIGKILL


# Through the agent ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestClient]:
    with running_guest(tmp_path_factory.mktemp("guest")) as guest:
        yield guest


def test_exec_through_a_slow_callback_is_whole(client: GuestClient) -> None:
    """~11 MB through a callback slower than the program: held back, not truncated
    (a backlog alone would have dropped what did not fit)."""
    expected = _seq(1_500_000)
    seen: list[int] = []

    def slow(data: bytes) -> None:
        seen.append(len(data))
        time.sleep(0.05)

    res = client.exec(["seq", "1", "1500000"], cwd="/", max_output=16 << 20, on_stdout=slow)
    assert res.exit_code == 0 and not res.truncated
    assert res.stdout == expected and sum(seen) == len(expected)


def test_wait_replays_tails_larger_than_the_backlog(client: GuestClient) -> None:
    """The tails a late client gets first are bounded already (max_output): all of them
    are sent, even past one backlog."""
    script = "head -c 3000000 /dev/zero; head -c 2500000 /dev/zero | tr '\\0' e >&2"
    pid = client.start(["sh", "-c", script], cwd="/", max_output=4 << 20)
    assert client.wait(pid, timeout=30).exit_code == 0
    got: list[bytes] = []
    res = client.wait(pid, timeout=30, on_stdout=got.append, max_output=4 << 20)
    assert res.exit_code == 0 and not res.truncated
    assert res.stdout == b"\0" * 3000000 and res.stderr == b"e" * 2500000
    assert b"".join(got) == res.stdout
