"""``sandbox.pty``: real terminals in a sandbox, on the embedded engine and through a
gateway's WebSocket (the conftest runs each test both ways)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from ptyscreen import Screen

from agent_sandbox import AsyncSandbox, Sandbox
from agent_sandbox.core.errors import (
    InvalidArgumentError,
    NotFoundError,
    SandboxTimeoutError,
    WrongStateError,
)

pytestmark = pytest.mark.integration
PROMPT = r"[#$] $"


def test_a_login_shell_on_a_real_terminal(sandbox: Sandbox) -> None:
    screen = Screen()
    term = sandbox.pty.create(cols=100, rows=30, envs={"GREETING": "hi"}, on_data=screen)
    screen.expect(r"/workspace# ")  # a login shell, in the template's workdir
    term.send_input("tty; stty size; echo $TERM $GREETING; ps -o pgid= $$\n")
    screen.expect(r"/dev/pts/\d+\r\n30 100\r\nxterm-256color hi\r\n")
    term.resize(132, 43)
    term.send_input("stty size\n")
    screen.expect(r"43 132\r\n")
    # Full-screen programs: the alternate screen and cursor addressing reach the client.
    term.send_input("tput smcup; tput cup 5 10; echo AT; tput rmcup\n")
    screen.expect(r"\x1b\[\?1049h")
    screen.expect(r"\x1b\[6;11HAT")
    term.send_input("sleep 30\n")
    # Ctrl-C once sleep runs (not while the shell still reads its line: a loaded host).
    deadline = time.monotonic() + 15
    while sandbox.commands.run("pgrep -x sleep", timeout=10).exit_code != 0:
        assert time.monotonic() < deadline, "sleep 30 never started"
        time.sleep(0.1)
    started = time.monotonic()
    term.send_input(b"\x03")
    term.send_input("echo rc=$?\n")
    screen.expect("rc=130")
    assert time.monotonic() - started < 10
    with pytest.raises(SandboxTimeoutError):
        term.wait(timeout=0.2)
    term.send_input(b"\x04")  # Ctrl-D: end of input for the shell
    assert term.wait(15) == 0
    assert term.exit_code == 0
    with pytest.raises(WrongStateError, match="ended"):
        term.send_input("late\n")


def test_a_command_instead_of_a_shell(sandbox: Sandbox) -> None:
    screen = Screen()
    term = sandbox.pty.create(cmd="test -t 0 && test -t 1 && pwd && exit 5", cwd="/tmp",
                              on_data=screen)
    assert term.wait(15) == 5
    assert screen.text() == "/tmp\r\n"


def test_a_terminal_as_the_unprivileged_user(sandbox: Sandbox) -> None:
    screen = Screen()
    term = sandbox.pty.create(user="user", on_data=screen, cmd=(
        "id -u; echo $HOME $USER; pwd; stat -c %u $(tty); touch /workspace/u ~/h && echo ok; "
        "touch /etc/x 2>/dev/null || echo denied"))
    assert term.wait(15) == 0
    assert screen.text() == "1000\r\n/home/user user\r\n/workspace\r\n1000\r\nok\r\ndenied\r\n"
    with pytest.raises(NotFoundError, match="no user 'nobody2'"):
        sandbox.pty.create(user="nobody2", cmd="true")


def test_ten_terminals_at_once(sandbox: Sandbox) -> None:
    def one(i: int) -> tuple[int, str]:
        screen = Screen()
        term = sandbox.pty.create(cols=60 + i, rows=20, on_data=screen)
        screen.expect(PROMPT)
        term.send_input(f"stty size; echo tag-$((100+{i})); exit {i}\n")
        return term.wait(60), screen.text()

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(one, range(10)))
    for i, (code, text) in enumerate(results):
        assert code == i
        assert f"20 {60 + i}\r\n" in text and f"tag-{100 + i}" in text


def test_reconnect_to_a_running_terminal(sandbox: Sandbox) -> None:
    screen = Screen()
    term = sandbox.pty.create(on_data=screen)
    term.send_input("export KEPT=yes; echo before-$((40+2))\n")
    screen.expect("before-42")
    term.disconnect()
    with pytest.raises(WrongStateError, match="detached"):
        term.wait(5)
    # Another client (a fresh handle on the same sandbox) takes it over: the recent output
    # first, then the same shell, its state intact.
    again = Screen()
    other = Sandbox.connect(sandbox.sandbox_id).pty.connect(term.pid, on_data=again)
    again.expect("before-42")
    other.send_input("echo kept=$KEPT\n")
    again.expect("kept=yes")
    other.send_input("exit 3\n")
    assert other.wait(15) == 3


def test_kill_by_pid(sandbox: Sandbox) -> None:
    term = sandbox.pty.create(cmd="sleep 600")
    assert sandbox.pty.kill(term.pid)
    assert term.wait(15) == 137
    assert not sandbox.pty.kill(term.pid)
    assert not term.kill()


def test_bad_arguments(sandbox: Sandbox) -> None:
    with pytest.raises(InvalidArgumentError, match="cols"):
        sandbox.pty.create(cols=0)
    with pytest.raises(InvalidArgumentError, match="rows"):
        sandbox.pty.create(rows=100_000)
    with pytest.raises(InvalidArgumentError, match="relative"):
        sandbox.pty.create(cwd="tmp")
    with pytest.raises(NotFoundError, match="working directory"):
        sandbox.pty.create(cwd="/no/such/dir")
    with pytest.raises(NotFoundError, match="no terminal with pid"):
        sandbox.pty.connect(3_999_999)
    term = sandbox.pty.create(cmd="sleep 600")
    try:
        with pytest.raises(InvalidArgumentError, match="bytes or str"):
            term.send_input(42)  # type: ignore[arg-type]
    finally:
        term.kill()


def test_a_failing_callback_detaches(sandbox: Sandbox) -> None:
    def broken(_: bytes) -> None:
        raise ValueError("boom")

    term = sandbox.pty.create(on_data=broken)
    with pytest.raises(Exception, match="on_data raised ValueError"):
        term.wait(15)
    screen = Screen()
    again = sandbox.pty.connect(term.pid, on_data=screen)
    again.send_input("exit 4\n")
    assert again.wait(15) == 4


def test_an_attached_terminal_keeps_the_sandbox_awake() -> None:
    with Sandbox.create(timeout=2) as sb:
        term = sb.pty.create(on_data=Screen())
        time.sleep(5)  # idle, but attached: no auto-pause
        assert sb.info().state == "running"
        term.disconnect()
        deadline = time.monotonic() + 30
        while sb.info().state != "paused":
            assert time.monotonic() < deadline, "never paused after the client detached"
            time.sleep(0.25)


def test_async_terminal_with_a_coroutine_callback() -> None:
    async def main() -> tuple[int, bytes]:
        chunks: list[bytes] = []

        async def on_data(data: bytes) -> None:
            chunks.append(data)

        async with await AsyncSandbox.create() as sb:
            term = await sb.pty.create(on_data=on_data)
            await term.send_input("echo async-$((2*21)); exit 6\n")
            code = await term.wait(30)
            return code, b"".join(chunks)

    code, output = asyncio.run(main())
    assert code == 6 and b"async-42" in output
