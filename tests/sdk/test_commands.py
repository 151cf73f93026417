"""Commands: exit codes, streaming callbacks, background processes, limits, stdin."""

from __future__ import annotations

import threading
import time

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.core.errors import InvalidArgumentError

pytestmark = pytest.mark.integration


def test_cwd_envs_and_stdin(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/workspace/sub")
    assert sandbox.commands.run("pwd", cwd="/workspace/sub").stdout == "/workspace/sub\n"
    assert sandbox.commands.run("echo $X-$Y", envs={"X": "1", "Y": "2"}).stdout == "1-2\n"
    assert sandbox.commands.run("tr a-z A-Z", stdin="shout\n").stdout == "SHOUT\n"


def test_streaming_delivers_lines_before_the_command_ends(sandbox: Sandbox) -> None:
    seen: list[tuple[float, str]] = []
    result = sandbox.commands.run(
        "for i in 1 2 3 4 5 6 7 8 9 10; do echo line$i; sleep 0.1; done",
        on_stdout=lambda text: seen.append((time.monotonic(), text)),
    )
    ended = time.monotonic()
    assert result.exit_code == 0
    assert "".join(t for _, t in seen) == result.stdout
    assert result.stdout.splitlines()[0] == "line1"
    first_at = seen[0][0]
    # The first line arrived while ~0.9 s of the command was still to run.
    assert ended - first_at > 0.6


def test_stderr_callback(sandbox: Sandbox) -> None:
    errs: list[str] = []
    sandbox.commands.run("echo bad >&2", on_stderr=errs.append)
    assert "".join(errs) == "bad\n"


def test_timeout_kills_the_command(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = sandbox.commands.run("echo before; sleep 30", timeout=1)
    assert time.monotonic() - started < 10
    assert result.timed_out and result.exit_code != 0
    assert result.stdout == "before\n"
    assert sandbox.commands.run("echo after").stdout == "after\n"


def test_output_is_capped_keeping_the_tail(sandbox: Sandbox) -> None:
    # 3 MB of output against the 1 MiB per-stream budget.
    result = sandbox.commands.run("seq 1 400000; echo THE-END")
    assert result.truncated
    assert len(result.stdout.encode()) <= 1 << 20
    assert result.stdout.endswith("400000\nTHE-END\n")


def test_background_command_survives_and_can_be_tailed_and_killed(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run(
        "i=0; while :; do i=$((i+1)); echo tick$i; sleep 0.1; done", background=True)
    assert handle.pid > 0
    time.sleep(0.5)
    # A second SDK object (as another client would) finds the process.
    again = Sandbox.connect(sandbox.sandbox_id)
    assert handle.pid in {p.pid for p in again.commands.list() if p.running}
    out = again.commands.connect(handle.pid).output()
    assert out.running and "tick1\n" in out.stdout
    assert handle.kill()
    result = handle.wait(timeout=5)
    assert result.exit_code == 137
    assert not handle.output().running


def test_background_streams_to_callbacks_and_takes_stdin(sandbox: Sandbox) -> None:
    got: list[str] = []
    done = threading.Event()

    def collect(text: str) -> None:
        got.append(text)
        if "ECHO:two" in "".join(got):
            done.set()

    handle = sandbox.commands.run("while read l; do echo ECHO:$l; done", background=True,
                                  on_stdout=collect, stdin="one\n")
    handle.send_stdin("two\n")
    assert done.wait(10), got
    handle.send_stdin("", close=True)
    assert handle.wait(timeout=10).exit_code == 0
    assert "ECHO:one\nECHO:two\n" in "".join(got)


def test_wait_on_a_finished_process_returns_its_result(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("echo done; exit 7", background=True)
    result = handle.wait(timeout=10)
    assert (result.exit_code, result.stdout) == (7, "done\n")


def test_unknown_process_and_bad_commands(sandbox: Sandbox) -> None:
    from agent_sandbox.core.errors import NotFoundError

    with pytest.raises(NotFoundError):
        sandbox.commands.connect(999999).output()
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        sandbox.commands.run("   ")
    with pytest.raises(InvalidArgumentError, match="relative"):
        sandbox.commands.run("ls", cwd="workspace")
    with pytest.raises(InvalidArgumentError, match="timeout"):
        sandbox.commands.run("ls", timeout=-1)
    with pytest.raises(NotFoundError, match="working directory /no/such/dir"):
        sandbox.commands.run("ls", cwd="/no/such/dir")
