"""envd's Process service through the real e2b SDK (unmodified user code): commands in the
foreground and background, streaming callbacks, stdin, connect, list, kill, timeouts,
errors, terminals; and the async SDK. One sandbox for the module: each test cleans up
the processes it starts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sb(gateway_env: E2BGateway) -> Iterator[Any]:
    from e2b import Sandbox

    box = Sandbox.create()
    yield box
    box.kill()


def _running(sb: Any) -> dict[int, Any]:
    return {p.pid: p for p in sb.commands.list()}


def _until(check: Any, what: str, limit: float = 30.0) -> None:
    """Poll ``check`` until it holds (a bound against hanging, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"still not {what} after {limit:g}s"
        time.sleep(0.1)


def test_foreground_run(sb: Any) -> None:
    result = sb.commands.run("echo out; echo err >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 0)
    assert result.error is None


def test_default_user_and_cwd_are_e2bs(sb: Any) -> None:
    assert sb.commands.run("pwd; whoami; echo $HOME").stdout == "/home/user\nuser\n/home/user\n"
    assert sb.commands.run("pwd; whoami", user="root").stdout == "/root\nroot\n"


def test_envs_and_cwd(sb: Any) -> None:
    result = sb.commands.run('echo "$FOO"; pwd', envs={"FOO": "bar baz"}, cwd="/tmp")
    assert result.stdout == "bar baz\n/tmp\n"


def test_nonzero_exit_raises_command_exit(sb: Any) -> None:
    from e2b import CommandExitException

    with pytest.raises(CommandExitException) as caught:
        sb.commands.run("echo partial; echo oops >&2; exit 3")
    assert caught.value.exit_code == 3
    assert (caught.value.stdout, caught.value.stderr) == ("partial\n", "oops\n")


def test_callbacks_get_output_as_it_comes(sb: Any) -> None:
    """The command waits for a file the stdout callback makes when it sees the first line
    (and the stderr one for the second): output held until the end would never come."""
    sb.commands.run("rm -f /tmp/go1 /tmp/go2")
    seen: list[tuple[str, str]] = []

    def on_stdout(text: str) -> None:
        seen.append(("out", text))
        if "first" in text:
            sb.commands.run("touch /tmp/go1")

    def on_stderr(text: str) -> None:
        seen.append(("err", text))
        if "second" in text:
            sb.commands.run("touch /tmp/go2")

    result = sb.commands.run(
        "echo first; until [ -e /tmp/go1 ]; do sleep 0.05; done; echo second >&2; "
        "until [ -e /tmp/go2 ]; do sleep 0.05; done; echo third",
        on_stdout=on_stdout, on_stderr=on_stderr, timeout=60)
    assert result.stdout == "first\nthird\n" and result.stderr == "second\n"
    assert [kind for kind, _ in seen] == ["out", "err", "out"]


def test_stdin_is_closed_unless_asked_for(sb: Any) -> None:
    assert sb.commands.run("cat; echo end").stdout == "end\n"  # EOF at once, no hang


def test_send_stdin_then_close(sb: Any) -> None:
    handle = sb.commands.run("cat; echo eof", background=True, stdin=True)
    handle.send_stdin("hello\n")
    sb.commands.send_stdin(handle.pid, b"bytes\n")
    handle.close_stdin()
    result = handle.wait()
    assert result.stdout == "hello\nbytes\neof\n"


def test_stream_input(sb: Any) -> None:
    handle = sb.commands.run("cat", background=True, stdin=True)
    sb.commands.stream_input(handle.pid, iter(["one\n", b"two\n"]))
    handle.close_stdin()
    assert handle.wait().stdout == "one\ntwo\n"


def test_background_then_wait(sb: Any) -> None:
    handle = sb.commands.run("read -r x; echo got-$x", background=True, stdin=True)
    assert handle.pid > 0 and handle.pid in _running(sb)
    handle.send_stdin("it\n")
    assert handle.wait().stdout == "got-it\n"
    _until(lambda: handle.pid not in _running(sb), "gone from commands.list()")


def test_background_kill(sb: Any) -> None:
    from e2b import CommandExitException

    handle = sb.commands.run("sleep 600", background=True)
    assert handle.pid in _running(sb)
    assert handle.kill() is True
    with pytest.raises(CommandExitException) as caught:
        handle.wait()
    assert caught.value.exit_code == 137  # 128 + SIGKILL
    assert handle.pid not in _running(sb)
    assert sb.commands.kill(handle.pid) is False  # ended: envd's NOT_FOUND


def test_list_reports_the_config(sb: Any) -> None:
    handle = sb.commands.run("sleep 600", background=True, envs={"X": "1"}, cwd="/tmp")
    try:
        info = _running(sb)[handle.pid]
        assert (info.cmd, info.args) == ("/bin/bash", ["-l", "-c", "sleep 600"])
        assert (info.envs, info.cwd, info.tag) == ({"X": "1"}, "/tmp", None)
    finally:
        handle.kill()


def test_connect_after_disconnect(sb: Any) -> None:
    handle = sb.commands.run("echo before; read -r x; echo after-$x", background=True,
                             stdin=True)
    handle.disconnect()
    assert handle.pid in _running(sb)  # disconnecting does not kill it
    again = sb.commands.connect(handle.pid)
    sb.commands.send_stdin(handle.pid, "1\n")
    result = again.wait()
    assert result.stdout == "before\nafter-1\n"  # what the sandbox held, then the rest


def test_timeout_kills_the_command(sb: Any) -> None:
    from e2b import TimeoutException

    with pytest.raises(TimeoutException):
        sb.commands.run("sleep 600 # timeout-test", timeout=2)
    _until(lambda: not [p for p in _running(sb).values() if "timeout-test" in " ".join(p.args)],
           "killed at the timeout")


def test_unknown_process(sb: Any) -> None:
    from e2b import NotFoundException

    with pytest.raises(NotFoundException):
        sb.commands.connect(4_000_000)
    with pytest.raises(NotFoundException):
        sb.commands.send_stdin(4_000_000, "x")
    with pytest.raises(NotFoundException):
        sb.commands.close_stdin(4_000_000)
    assert sb.commands.kill(4_000_000) is False


def test_bad_arguments_are_named(sb: Any) -> None:
    from e2b import InvalidArgumentException, NotFoundException

    with pytest.raises(InvalidArgumentException, match="account name"):
        sb.commands.run("true", user="bad user")
    with pytest.raises(NotFoundException, match="no user 'ghost'"):
        sb.commands.run("true", user="ghost")
    with pytest.raises(NotFoundException, match="/nope"):
        sb.commands.run("true", cwd="/nope")


def test_big_output_streams_through(sb: Any) -> None:
    """All of it, from the very start: a fast producer's output must not be lost while the
    stream attaches (it was, about one run in six: only the last 1 MiB came)."""
    for _ in range(10):
        chunks: list[str] = []
        result = sb.commands.run("head -c 3000000 /dev/zero | tr '\\0' a",
                                 retain_output=False, on_stdout=chunks.append)
        assert result.exit_code == 0 and len(chunks) > 1
        assert sum(map(len, chunks)) == 3_000_000 and set("".join(chunks)) == {"a"}


def test_pty_create_input_resize_and_exit(sb: Any) -> None:
    from e2b import PtySize

    handle = sb.pty.create(PtySize(rows=24, cols=80))
    assert handle.pid in _running(sb)
    sb.pty.resize(handle.pid, PtySize(rows=30, cols=100))
    sb.pty.send_stdin(handle.pid, b"stty size; echo pty-$((40+2)); exit 5\n")
    output = bytearray()
    with pytest.raises(Exception) as caught:  # exit 5: the handle raises CommandExitException
        handle.wait(on_pty=output.extend)
    assert getattr(caught.value, "exit_code", None) == 5
    text = output.decode(errors="replace")
    assert "30 100" in text and "pty-42" in text


def test_pty_connect_after_disconnect(sb: Any) -> None:
    from e2b import PtySize

    handle = sb.pty.create(PtySize(rows=24, cols=80))
    handle.disconnect()  # the terminal keeps running; input attaches on its own
    sb.pty.send_stdin(handle.pid, b"echo again-$((2+3)); exit\n")
    output = bytearray()
    result = sb.pty.connect(handle.pid).wait(on_pty=output.extend)
    assert result.exit_code == 0 and b"again-5" in output


def test_pty_kill(sb: Any) -> None:
    from e2b import PtySize

    handle = sb.pty.create(PtySize(rows=24, cols=80))
    assert sb.pty.kill(handle.pid) is True
    with pytest.raises(Exception):  # noqa: B017 - killed: a non-zero end
        handle.wait()
    assert sb.pty.kill(handle.pid) is False


def test_async_sdk(gateway_env: E2BGateway) -> None:
    from e2b import AsyncSandbox

    async def flow() -> None:
        box = await AsyncSandbox.create()
        try:
            result = await box.commands.run("echo async-$((6*7))")
            assert (result.stdout, result.exit_code) == ("async-42\n", 0)
            handle = await box.commands.run("sleep 0.2; echo bg", background=True)
            assert (await handle.wait()).stdout == "bg\n"
        finally:
            await box.kill()

    asyncio.run(flow())
