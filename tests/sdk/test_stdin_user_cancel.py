"""Streamed stdin, running as the sandbox's ``user``, the timeout exit code, and a
cancelled call stopping its command: on the embedded engine and through a gateway (the
conftest runs each test for both)."""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from collections.abc import Iterator

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.core.cancel import CallCancel
from agent_sandbox.core.errors import CancelledCallError, InvalidArgumentError, NotFoundError
from agent_sandbox.core.models import TIMEOUT_EXIT_CODE

pytestmark = pytest.mark.integration


def test_a_stream_is_fed_to_stdin_while_the_command_runs(sandbox: Sandbox) -> None:
    answered = threading.Event()
    got: list[str] = []

    def on_stdout(text: str) -> None:
        got.append(text)
        if "ECHO:one" in "".join(got):
            answered.set()

    def chunks() -> Iterator[bytes]:
        yield b"one\n"
        # The next chunk is produced only once the first was answered: nothing waits for
        # the end of stdin before starting the command or returning its output.
        assert answered.wait(30), got
        yield b"two\n"

    result = sandbox.commands.run("while read l; do echo ECHO:$l; done", stdin=chunks(),
                                  on_stdout=on_stdout, timeout=60)
    assert (result.exit_code, result.stdout) == (0, "ECHO:one\nECHO:two\n")


def test_a_binary_file_as_stdin(sandbox: Sandbox) -> None:
    data = os.urandom(3 << 20)
    result = sandbox.commands.run("sha256sum | cut -d' ' -f1; wc -c </dev/null",
                                  stdin=io.BytesIO(data), timeout=120)
    assert result.stdout.split()[0] == hashlib.sha256(data).hexdigest(), result


def test_timeout_exit_code_is_124(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("sleep 30", timeout=1)
    assert (result.timed_out, result.exit_code) == (True, TIMEOUT_EXIT_CODE)
    fed = sandbox.commands.run("cat; sleep 30", stdin=iter([b"in\n"]), timeout=2)
    assert (fed.timed_out, fed.exit_code, fed.stdout) == (True, TIMEOUT_EXIT_CODE, "in\n")
    assert sandbox.commands.run("kill -TERM $$").exit_code == 128 + 15


def test_run_as_the_user_account(sandbox: Sandbox) -> None:
    result = sandbox.commands.run('id -u; id -g; id -un; echo "$HOME $USER"; pwd; '
                                  'touch ~/mine /workspace/mine && stat -c %U ~/mine '
                                  '/workspace/mine /workspace', user="user")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["1000", "1000", "user", "/home/user user",
                                          "/workspace", "user", "user", "user"]
    denied = sandbox.commands.run("touch /etc/x", user="user")
    assert denied.exit_code != 0 and "Permission denied" in denied.stderr
    assert sandbox.commands.run("id -u", user="root").stdout == "0\n"
    assert sandbox.commands.run("id -u").stdout == "0\n"  # root stays the default
    handle = sandbox.commands.run("id -un; cat", background=True, user="user", stdin="x\n")
    handle.send_stdin("", close=True)
    assert handle.wait(timeout=30).stdout == "user\nx\n"
    fed = sandbox.commands.run("id -un; cat", user="user", stdin=iter([b"streamed\n"]))
    assert fed.stdout == "user\nstreamed\n"


def test_unknown_and_malformed_users_are_refused(sandbox: Sandbox) -> None:
    with pytest.raises(NotFoundError, match="no user 'nobody-here'"):
        sandbox.commands.run("true", user="nobody-here")
    for bad in ("", "a:b", "../x", "x" * 40, "a\nb"):
        with pytest.raises(InvalidArgumentError, match="account name"):
            sandbox.commands.run("true", user=bad)


def _running(sandbox: Sandbox, marker: str) -> bool:
    out = sandbox.commands.run(f"ps -eo args | grep -v grep | grep -c '{marker}' || true")
    return out.stdout.strip() != "0"


@pytest.mark.parametrize("fed", [False, True], ids=["plain", "stdin-stream"])
def test_cancelling_the_call_stops_the_command(sandbox: Sandbox, fed: bool) -> None:
    call = CallCancel()
    started = threading.Event()
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = call.run(
                sandbox.commands.run, "echo started; sleep 41; echo never", timeout=120,
                on_stdout=lambda t: started.set(), stdin=iter([b"x"]) if fed else None)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(60)
    assert _running(sandbox, "sleep 41")
    begun = time.monotonic()
    call.cancel()
    worker.join(30)
    assert not worker.is_alive()
    assert isinstance(outcome.get("error"), CancelledCallError), outcome
    deadline = time.monotonic() + 10
    while _running(sandbox, "sleep 41") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(sandbox, "sleep 41"), "the command outlived the cancelled call"
    print(f"cancel -> command gone in {time.monotonic() - begun:.2f}s")
