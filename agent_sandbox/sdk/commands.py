"""``sandbox.commands``: run shell commands, in the foreground or the background."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal, overload

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.models import CommandResult, ProcessInfo, ProcessOutput
from agent_sandbox.core.provider import OutputCallback, Provider, StdinData


def _as(user: str | None) -> dict[str, str]:
    # Only when given: a Provider written before ``user`` existed still runs as root.
    return {} if user is None else {"user": user}


class CommandHandle:
    """A background command: it keeps running after the call that started it returns."""

    def __init__(self, provider: Provider, sandbox_id: str, pid: int,
                 on_stdout: OutputCallback | None = None,
                 on_stderr: OutputCallback | None = None) -> None:
        self._provider = provider
        self._sandbox_id = sandbox_id
        self.pid = pid
        self._tail: threading.Thread | None = None
        if on_stdout or on_stderr:
            # Stream to the callbacks from a thread, as E2B does for background commands.
            self._tail = threading.Thread(
                target=self._provider.wait, args=(sandbox_id, pid),
                kwargs={"on_stdout": on_stdout, "on_stderr": on_stderr},
                name=f"abx-tail-{pid}", daemon=True)
            self._tail.start()

    def wait(self, timeout: float | None = None, on_stdout: OutputCallback | None = None,
             on_stderr: OutputCallback | None = None) -> CommandResult:
        """Block until the command ends (or ``timeout`` seconds pass; it keeps running)."""
        return self._provider.wait(self._sandbox_id, self.pid, timeout=timeout,
                                   on_stdout=on_stdout, on_stderr=on_stderr)

    def output(self) -> ProcessOutput:
        """Everything it printed so far (the tail, if it printed more than the budget)."""
        return self._provider.process_output(self._sandbox_id, self.pid)

    def kill(self) -> bool:
        return self._provider.kill_process(self._sandbox_id, self.pid)

    def send_stdin(self, data: str | bytes, close: bool = False) -> None:
        self._provider.send_stdin(self._sandbox_id, self.pid, data, close=close)

    def __repr__(self) -> str:
        return f"CommandHandle(sandbox_id={self._sandbox_id!r}, pid={self.pid})"


class Commands:
    def __init__(self, provider: Provider, sandbox_id: str) -> None:
        self._provider = provider
        self._sandbox_id = sandbox_id

    @overload
    def run(self, cmd: str, cwd: str | None = ..., envs: dict[str, str] | None = ...,
            timeout: float = ..., background: Literal[False] = ...,
            on_stdout: OutputCallback | None = ..., on_stderr: OutputCallback | None = ...,
            stdin: StdinData | None = ..., user: str | None = ...) -> CommandResult: ...

    @overload
    def run(self, cmd: str, cwd: str | None = ..., envs: dict[str, str] | None = ...,
            timeout: float = ..., *, background: Literal[True],
            on_stdout: OutputCallback | None = ..., on_stderr: OutputCallback | None = ...,
            stdin: str | bytes | None = ..., user: str | None = ...) -> CommandHandle: ...

    def run(self, cmd: str, cwd: str | None = None, envs: dict[str, str] | None = None,
            timeout: float = 60, background: bool = False,
            on_stdout: OutputCallback | None = None, on_stderr: OutputCallback | None = None,
            stdin: StdinData | None = None,
            user: str | None = None) -> CommandResult | CommandHandle:
        """Run ``cmd`` through ``sh -c`` inside the sandbox, in ``cwd`` (default: the
        template's workdir, /workspace unless the template says otherwise), as root or as
        ``user`` (an account of the sandbox: ``"user"``, uid 1000, exists in every
        template, with HOME /home/user; /workspace is its own).

        Foreground: returns when it ends, with exit code and output (the tail beyond the
        output budget, ``truncated`` set); past ``timeout`` it is killed and the result has
        ``timed_out`` and exit code 124. ``stdin``: text, bytes, or a stream (chunks, or a
        binary file such as ``sys.stdin.buffer``) read while the command runs.
        ``background=True``: returns a handle at once (``stdin`` then text or bytes).
        """
        if background:
            if stdin is not None and not isinstance(stdin, str | bytes):
                raise InvalidArgumentError("a background command takes stdin as text or "
                                           "bytes; stream more with handle.send_stdin()")
            pid = self._provider.start(self._sandbox_id, cmd, cwd=cwd, envs=envs,
                                       **_as(user))
            if stdin is not None:
                self._provider.send_stdin(self._sandbox_id, pid, stdin)
            return CommandHandle(self._provider, self._sandbox_id, pid, on_stdout, on_stderr)
        return self._provider.run(self._sandbox_id, cmd, cwd=cwd, envs=envs, timeout=timeout,
                                  stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr,
                                  **_as(user))

    def list(self) -> list[ProcessInfo]:
        return self._provider.processes(self._sandbox_id)

    def kill(self, pid: int) -> bool:
        return self._provider.kill_process(self._sandbox_id, pid)

    def connect(self, pid: int, on_stdout: Callable[[str], None] | None = None,
                on_stderr: Callable[[str], None] | None = None) -> CommandHandle:
        """A handle for a background command started earlier (by any client)."""
        return CommandHandle(self._provider, self._sandbox_id, pid, on_stdout, on_stderr)
