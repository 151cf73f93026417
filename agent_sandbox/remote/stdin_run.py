"""A foreground command fed from a stream (a pipe, a file) through the gateway.

One HTTP request cannot carry a growing request body and the output coming back at the
same time, so the command is started as a process, its stdin sent in chunks
(``POST .../stdin``) from a thread while its output streams back (``POST .../wait``), and
it is killed at its timeout or when the call is cancelled: the same result as a foreground
``run`` with bytes (``timed_out`` and exit code 124 at the deadline). Nothing is buffered
beyond one chunk.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import IO, Any

from agent_sandbox.core import cancel
from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.models import TIMEOUT_EXIT_CODE, CommandResult
from agent_sandbox.core.provider import OutputCallback

CHUNK = 256 * 1024  # per stdin request (base64 in JSON: ~340 KiB on the wire)
_KILL_GRACE = 10.0  # seconds to see the exit code of a command we killed


def stdin_chunks(data: Iterable[bytes] | IO[bytes]) -> Iterator[bytes]:
    """Non-empty chunks of at most CHUNK bytes, as they come (a pipe is not read ahead)."""
    read = getattr(data, "read1", None) or getattr(data, "read", None)
    items: Iterable[Any] = iter(lambda: read(CHUNK), b"") if read is not None else data
    for item in items:
        raw = item.encode() if isinstance(item, str) else bytes(item)
        for start in range(0, len(raw), CHUNK):
            yield raw[start:start + CHUNK]


def run_fed(provider: Any, sandbox_id: str, cmd: str, *, cwd: str | None,
            envs: dict[str, str] | None, timeout: float | None,
            stdin: Iterable[bytes] | IO[bytes], on_stdout: OutputCallback | None,
            on_stderr: OutputCallback | None, **start_kw: Any) -> CommandResult:
    pid = provider.start(sandbox_id, cmd, cwd=cwd, envs=envs, **start_kw)

    def kill() -> None:
        try:
            provider.kill_process(sandbox_id, pid)
        except SandboxError:
            pass  # already gone

    call = cancel.current()
    # cancel() must not block (it may run on an event loop): the kill goes on a thread.
    key = None if call is None else call.register(
        lambda: threading.Thread(target=kill, name="abx-kill", daemon=True).start())
    feeder = threading.Thread(target=_feed, args=(provider, sandbox_id, pid, stdin),
                              name=f"abx-stdin-{pid}", daemon=True)
    feeder.start()
    try:
        result = provider.wait(sandbox_id, pid, timeout=timeout,
                               on_stdout=on_stdout or _ignore, on_stderr=on_stderr or _ignore)
        if not result.timed_out:
            return result
        kill()  # past its deadline: killed, as a foreground run is
        final = provider.wait(sandbox_id, pid, timeout=_KILL_GRACE)  # its exit, no replay
        return result.model_copy(update={"exit_code": TIMEOUT_EXIT_CODE, "timed_out": True,
                                         "truncated": result.truncated or final.truncated})
    except BaseException:
        kill()  # cancelled or broken: never leave it running
        raise
    finally:
        if call is not None and key is not None:
            call.unregister(key)


def _feed(provider: Any, sandbox_id: str, pid: int, stdin: Iterable[bytes] | IO[bytes]) -> None:
    try:
        for chunk in stdin_chunks(stdin):
            provider.send_stdin(sandbox_id, pid, chunk)
        provider.send_stdin(sandbox_id, pid, b"", close=True)
    except (SandboxError, OSError, ValueError):
        pass  # the command ended (or stopped reading): its result says how


def _ignore(text: str) -> None:
    pass
