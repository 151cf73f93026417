"""The guest's terminals end to end through the host's attachment (``guest_pty``), with a
real agent subprocess: job control, Ctrl-C, resize, reattach with replay, many at once,
kill, bounds and bad requests."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from _agent import running_guest
from ptyscreen import Screen

from agent_sandbox.core.errors import (
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    WrongStateError,
)
from agent_sandbox.guest import protocol as proto
from agent_sandbox.guest.limits import PTY_LIVE_CAP, PTY_RING, PTY_VIEWERS_CAP
from agent_sandbox.guestlink.client import GuestClient
from agent_sandbox.guestlink.pty import GuestPty, open_pty, pty_kill

SHELL = ["/bin/bash", "--norc", "--noprofile", "-i"]
ENV = {"PATH": "/usr/bin:/bin", "PS1": "$ ", "TERM": "xterm", "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuestClient]:
    with running_guest(tmp_path_factory.mktemp("guest")) as guest:
        yield guest


def _open(client: GuestClient, screen: Screen | None = None, **req: Any) -> GuestPty:
    base: dict[str, Any] = {"op": "pty_create", "argv": SHELL, "cwd": "/tmp", "env": ENV,
                            "cols": 80, "rows": 24}
    base.update(req)
    return open_pty(client, base, screen, lambda pid, sig: pty_kill(client, pid, sig))


def _attach(client: GuestClient, pid: int, screen: Screen) -> GuestPty:
    return open_pty(client, {"op": "pty_attach", "pid": pid}, screen,
                    lambda pid, sig: pty_kill(client, pid, sig))


def test_a_real_terminal_with_job_control(client: GuestClient) -> None:
    screen = Screen()
    term = _open(client, screen, cols=100, rows=30)
    screen.expect(r"\$ ")
    term.send_input("tty; stty size; echo pid=$$; ps -o pid=,pgid=,sid=,tty=,comm= -t $(tty)\n")
    screen.expect(r"/dev/pts/\d+\r\n30 100\r\n")
    shell = int(screen.expect(r"pid=(\d+)").group(1))
    assert shell == term.pid
    rows = [line.split() for line in screen.expect(rb"(?s).*ps\r\n").group(0).decode()
            .splitlines() if line.strip().endswith(("bash", "ps"))]
    groups = {comm: (int(pid), int(pgid), int(sid)) for pid, pgid, sid, _, comm in rows[-2:]}
    # The shell leads its own session on the terminal; ps ran as a job of its own.
    assert groups["bash"] == (shell, shell, shell)
    assert groups["ps"][1] == groups["ps"][0] != shell and groups["ps"][2] == shell
    term.resize(120, 40)
    term.send_input("stty size\n")
    screen.expect(r"40 120\r\n")
    term.send_input("sleep 30\n")
    time.sleep(0.5)
    started = time.monotonic()
    term.send_input(b"\x03")  # Ctrl-C: SIGINT to the foreground job only
    term.send_input("echo rc=$?\n")
    screen.expect(r"rc=130")
    assert time.monotonic() - started < 10
    term.send_input("sleep 40\n")
    time.sleep(0.5)
    term.send_input(b"\x1a")  # Ctrl-Z: the job stops, the shell takes the terminal back
    screen.expect(r"Stopped\s+sleep 40")
    term.send_input("fg\n")
    screen.expect(r"sleep 40\r\n")
    time.sleep(0.3)
    term.send_input(b"\x03")
    term.send_input("echo rc=$?\n")
    screen.expect(r"rc=130")
    term.send_input(b"exit 7\n")
    assert term.wait(10) == 7
    assert term.exit_code == 7
    with pytest.raises(WrongStateError, match="has ended"):
        term.send_input("more")


def test_ctrl_d_ends_the_shell(client: GuestClient) -> None:
    screen = Screen()
    term = _open(client, screen)
    screen.expect(r"\$ ")
    term.send_input(b"\x04")
    assert term.wait(10) == 0


def test_detach_and_reattach_replays_recent_output(client: GuestClient) -> None:
    screen = Screen()
    term = _open(client, screen)
    term.send_input("echo first-$((6*7))\n")
    screen.expect("first-42")
    term.close()
    with pytest.raises(WrongStateError, match="detached"):
        term.wait(5)
    # Still running; what it printed while nobody watched is replayed to the next client.
    again = Screen()
    term2 = _attach(client, term.pid, again)
    again.expect("first-42")
    term2.send_input("echo second\n")
    again.expect("second")
    term2.send_input("exit 3\n")
    assert term2.wait(10) == 3
    # An ended terminal is kept for a while: a late client gets its output and exit code.
    late = Screen()
    assert _attach(client, term.pid, late).wait(10) == 3
    assert "second" in late.text()


def test_replay_is_bounded(client: GuestClient) -> None:
    first = Screen()
    term = _open(client, first, argv=["/bin/sh", "-c", "head -c 3000000 /dev/zero | "
                                                       "tr '\\0' x; echo; echo END; sleep 30"])
    first.expect("END", timeout=30)
    screen = Screen()
    again = _attach(client, term.pid, screen)
    screen.expect("END")
    time.sleep(0.2)
    assert len(first.data) > 3_000_000 and PTY_RING // 2 < len(screen.data) <= PTY_RING
    assert again.kill() and again.wait(10) == 137
    assert term.wait(10) == 137


def test_ten_terminals_at_once(client: GuestClient) -> None:
    def one(i: int) -> tuple[int, str]:
        screen = Screen()
        term = _open(client, screen, cols=50 + i)
        term.send_input(f"stty size; echo tag-{i}; exit {i}\n")
        return term.wait(30), screen.text()

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(one, range(10)))
    for i, (code, text) in enumerate(results):
        assert code == i and f"24 {50 + i}" in text and f"tag-{i}" in text


def test_kill(client: GuestClient) -> None:
    screen = Screen()
    term = _open(client, screen)
    term.send_input("sleep 60\n")
    time.sleep(0.3)
    assert pty_kill(client, term.pid, signal.SIGKILL)
    assert term.wait(10) == 137
    assert not term.kill()  # ended: nothing to signal
    assert not pty_kill(client, term.pid, signal.SIGKILL)


def test_output_waits_for_a_slow_client_then_drops(client: GuestClient) -> None:
    """A client that stops reading holds the program back for a while (as a slow real
    terminal would), then loses the oldest output; the terminal never blocks for good."""
    blocked = __import__("threading").Event()

    def stuck(_: bytes) -> None:
        blocked.wait(30)

    term = _open(client, stuck, argv=["/bin/sh", "-c", "head -c 20000000 /dev/zero; exit 4"])
    other = Screen()
    watcher = _attach(client, term.pid, other)
    assert watcher.wait(60) == 4  # ended though the first client never read a byte
    blocked.set()
    assert term.wait(30) == 4


def test_bad_requests(client: GuestClient) -> None:
    with pytest.raises(InvalidArgumentError, match="'cols'"):
        _open(client, cols=0)
    with pytest.raises(InvalidArgumentError, match="'rows'"):
        _open(client, rows=True)
    with pytest.raises(NotFoundError, match="working directory"):
        _open(client, cwd="/no/such/dir")
    with pytest.raises(NotFoundError, match="no such program"):
        _open(client, argv=["/no/such/program"])
    with pytest.raises(NotFoundError, match="no terminal with pid"):
        _attach(client, 4_000_000, Screen())
    with pytest.raises(NotFoundError, match="no terminal with pid"):
        pty_kill(client, 4_000_000, 9)


def test_a_client_sending_nonsense_is_cut_off_not_the_terminal(client: GuestClient) -> None:
    screen = Screen()
    term = _open(client, screen)
    term._conn.send({"resize": "huge"})
    with pytest.raises(Exception, match="guest closed"):
        term.wait(10)
    again = Screen()
    term2 = _attach(client, term.pid, again)
    term2.send_input("exit 9\n")
    assert term2.wait(10) == 9


def test_live_terminals_are_capped(client: GuestClient) -> None:
    terms = [_open(client, argv=["/bin/sleep", "60"]) for _ in range(PTY_LIVE_CAP)]
    try:
        with pytest.raises(ResourceExhaustedError, match="terminals are open"):
            _open(client, argv=["/bin/sleep", "60"])
    finally:
        for term in terms:
            term.kill()
    for term in terms:
        assert term.wait(10) == 137
    listed = client._call({"op": "pty_list"})["terminals"]
    assert all(not t["running"] for t in listed)


def test_clients_of_one_terminal_are_capped(client: GuestClient) -> None:
    term = _open(client, argv=["/bin/sleep", "60"])
    others = [_attach(client, term.pid, Screen()) for _ in range(PTY_VIEWERS_CAP - 1)]
    with pytest.raises(ResourceExhaustedError, match="clients are attached"):
        _attach(client, term.pid, Screen())
    others.pop().close()  # one leaves: another may come, once the guest has seen it go
    deadline = time.monotonic() + 10
    while True:
        try:
            others.append(_attach(client, term.pid, Screen()))
            break
        except ResourceExhaustedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    assert term.kill()
    assert all(t.wait(10) == 137 for t in [term, *others])


def test_frames_stay_within_the_protocol(client: GuestClient) -> None:
    """Output frames are at most one chunk: the host's bounded reader takes them."""
    sizes: list[int] = []
    term = _open(client, lambda data: sizes.append(len(data)),
                 argv=["/bin/sh", "-c", "head -c 5000000 /dev/zero"])
    assert term.wait(30) == 0
    assert sum(sizes) == 5_000_000 and max(sizes) <= proto.CHUNK
