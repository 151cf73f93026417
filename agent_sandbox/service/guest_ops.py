"""What an engine does inside a running sandbox: commands, files and code cells, each
checked here and carried out by the guest (whose answers are checked in guest_client)."""

from __future__ import annotations

import shlex
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from agent_sandbox.core import validate
from agent_sandbox.core.bounds import MAX_FILE_OFFSET
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError
from agent_sandbox.core.models import (
    TIMEOUT_EXIT_CODE,
    CodeContext,
    CommandResult,
    EntryInfo,
    Execution,
    FileChunks,
    ProcessInfo,
    ProcessOutput,
    Result,
)
from agent_sandbox.core.watch import MAX_WATCH_TIMEOUT, WatchStream
from agent_sandbox.guestlink.client import ExecResult, GuestProtocolError
from agent_sandbox.service.access import GuestAccess
from agent_sandbox.service.activity import streamed

OutputCallback = Callable[[str], None]


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _text_callback(cb: OutputCallback | None) -> Callable[[bytes], None] | None:
    return None if cb is None else (lambda chunk: cb(_decode(chunk)))


class GuestOps(GuestAccess):
    """Commands, code cells and files: checked here, carried out by the guest."""

    # commands ---------------------------------------------------------------------------
    def run(
        self,
        sandbox_id: str,
        cmd: str,
        cwd: str | None = None,
        envs: dict[str, str] | None = None,
        timeout: float | None = None,
        stdin: str | bytes | Iterable[bytes] | IO[bytes] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        user: str | None = None,
        on_start: Callable[[int], None] | None = None,
        detach: bool = False,
    ) -> CommandResult:
        cmd = validate.command(cmd)
        row = self.row(sandbox_id)
        # A recipe's USER is its commands' default account.
        user = validate.user(user) or self.template_for(row).user or None
        cwd = validate.path(cwd or self.template_for(row).workdir, "cwd")
        timeout = validate.positive(timeout, "timeout", maximum=86400) or \
            (None if detach else self.config.command_timeout)
        env = self.env(row, envs)
        data = stdin.encode() if isinstance(stdin, str) else stdin  # or a stream of bytes
        result: ExecResult = self.call(sandbox_id, lambda g: g.exec(
            ["/bin/sh", "-c", cmd], cwd=cwd, env=env, timeout=timeout,
            max_output=self.config.max_output, stdin=data,
            on_stdout=_text_callback(on_stdout), on_stderr=_text_callback(on_stderr),
            user=user, on_start=on_start, detach=detach, stdin_open=detach,
        ), row)
        if result.timed_out:  # killed at its deadline: one convention for every client
            result.exit_code = TIMEOUT_EXIT_CODE
        return _command_result(result)

    def start(self, sandbox_id: str, cmd: str, cwd: str | None = None,
              envs: dict[str, str] | None = None, user: str | None = None) -> int:
        cmd = validate.command(cmd)
        row = self.row(sandbox_id)
        # A recipe's USER is its commands' default account.
        user = validate.user(user) or self.template_for(row).user or None
        cwd = validate.path(cwd or self.template_for(row).workdir, "cwd")
        env = self.env(row, envs)
        return self.call(sandbox_id, lambda g: g.start(
            ["/bin/sh", "-c", cmd], cwd=cwd, env=env, max_output=self.config.max_output,
            stdin_open=True, user=user,
        ), row)

    def process_output(self, sandbox_id: str, pid: int) -> ProcessOutput:
        pid = validate.positive(pid, "pid", allow_none=False, integer=True)
        out = self.call(sandbox_id, lambda g: g.output(pid, self.config.max_output))
        return ProcessOutput(pid=pid, stdout=_decode(out.stdout), stderr=_decode(out.stderr),
                             running=out.running, exit_code=out.exit_code,
                             truncated=out.truncated)

    def wait(self, sandbox_id: str, pid: int, timeout: float | None = None,
             on_stdout: OutputCallback | None = None,
             on_stderr: OutputCallback | None = None) -> CommandResult:
        pid = validate.positive(pid, "pid", allow_none=False, integer=True)
        timeout = validate.positive(timeout, "timeout", maximum=86400)
        result = self.call(sandbox_id, lambda g: g.wait(
            pid, timeout=timeout, on_stdout=_text_callback(on_stdout),
            on_stderr=_text_callback(on_stderr)))
        return _command_result(result)

    def kill_process(self, sandbox_id: str, pid: int, sig: int = signal.SIGKILL) -> bool:
        pid = validate.positive(pid, "pid", allow_none=False, integer=True)
        return self.call(sandbox_id, lambda g: g.kill(pid, int(sig)))

    def send_stdin(self, sandbox_id: str, pid: int, data: str | bytes,
                   close: bool = False) -> None:
        pid = validate.positive(pid, "pid", allow_none=False, integer=True)
        raw = data.encode() if isinstance(data, str) else data
        self.call(sandbox_id, lambda g: g.send_stdin(pid, raw, close=close))

    def processes(self, sandbox_id: str) -> list[ProcessInfo]:
        procs = self.call(sandbox_id, lambda g: g.ps())
        return [_process(p) for p in procs]

    def custom(self, sandbox_id: str, name: str, args: list[str] | None = None,
               **kw: Any) -> CommandResult:
        row = self.row(sandbox_id)
        commands = self.template_for(row).commands
        if name not in commands:
            known = ", ".join(sorted(commands)) or "none"
            raise NotFoundError(f"template {row.template!r} has no custom command {name!r} "
                                f"(available: {known})")
        if args is not None and not all(isinstance(a, str) for a in args):
            raise InvalidArgumentError("custom command args must be strings")
        cmd = commands[name]["cmd"] + "".join(" " + shlex.quote(a) for a in args or [])
        return self.run(sandbox_id, cmd, **kw)

    # code interpreter -------------------------------------------------------------------
    def run_code(self, sandbox_id: str, code: str, language: str | None = None,
                 timeout: float | None = 60, context: str | CodeContext | None = None,
                 on_stdout: OutputCallback | None = None,
                 on_stderr: OutputCallback | None = None,
                 on_result: Callable[[Result], None] | None = None) -> Execution:
        """Run a cell in the context's Jupyter kernel (the language's default context
        unless one is given); the kernel starts on first use and keeps its variables
        between calls."""
        ctx = context.id if isinstance(context, CodeContext) else context
        with self.activity.busy(sandbox_id):
            return self.code.run_code(
                sandbox_id, code, language=language, timeout=timeout, context=ctx,
                on_stdout=on_stdout, on_stderr=on_stderr, on_result=on_result)

    def create_code_context(self, sandbox_id: str, cwd: str | None = None,
                            language: str | None = None, user: str | None = None
                            ) -> CodeContext:
        """A new, independent interpreter in the sandbox (its own kernel), run as ``user``
        (an account of the sandbox) if given."""
        return self.code.create_context(sandbox_id, cwd=cwd, language=language,
                                                   user=user)

    def restart_code_context(self, sandbox_id: str,
                             context: str | CodeContext | None = None) -> None:
        ctx = context.id if isinstance(context, CodeContext) else context
        self.code.restart_context(sandbox_id, ctx)

    def remove_code_context(self, sandbox_id: str, context: str | CodeContext) -> None:
        """End the context's kernel and forget the context."""
        ctx = context.id if isinstance(context, CodeContext) else context
        self.code.remove_context(sandbox_id, ctx)

    def list_code_contexts(self, sandbox_id: str) -> list[CodeContext]:
        return self.code.list_contexts(sandbox_id)

    # files ------------------------------------------------------------------------------
    def read_file(self, sandbox_id: str, path: str, offset: int = 0,
                  limit: int | None = None) -> Iterator[bytes]:
        path = validate.path(path)
        if isinstance(offset, bool) or not isinstance(offset, int) \
                or not 0 <= offset <= MAX_FILE_OFFSET:
            raise InvalidArgumentError(f"offset must be a whole number from 0 to 2**62, got "
                                       f"{offset!r}")
        limit = validate.positive(limit, "limit", integer=True, maximum=MAX_FILE_OFFSET)
        stream = self.call(sandbox_id, lambda g: g.read(path, offset=offset, limit=limit))
        try:  # a version goes into headers (ETag): the guest's is checked like any input
            version = _version(getattr(stream, "version", None))
        except GuestProtocolError:
            stream.close()
            raise
        return FileChunks(streamed(self.activity, sandbox_id, stream), version)

    def write_file(self, sandbox_id: str, path: str,
                   data: bytes | str | Iterable[bytes] | IO[bytes], mode: int = 0o644,
                   user: str | None = None, *, if_match: str | None = None,
                   lock_wait: float | None = None, lock_token: str | None = None,
                   metadata: dict[str, str] | None = None) -> int:
        """Write (create or replace) ``path``: one write of ours to it at a time, waiting
        at most ``lock_wait`` s (default 3) for its turn or another holder's lock
        (``LockedError``); with ``if_match`` only if the file is still at that version
        (``ConflictError``); ``lock_token``: the caller's own lock (``lock_file``);
        ``metadata``: the file's own (``core.file_metadata``), replacing what it had."""
        path = validate.path(path)
        user = validate.user(user)
        guarded = {"if_match": validate.version(if_match),
                   "lock_wait": validate.lock_wait(lock_wait),
                   "lock_token": validate.lock_token(lock_token),
                   "metadata": validate.file_metadata(metadata)}
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
            raise InvalidArgumentError(f"mode must be a permission number such as 0o644, "
                                       f"got {mode!r}")
        payload = data.encode() if isinstance(data, str) else data
        return self.call(sandbox_id, lambda g: g.write(path, payload, mode=mode, user=user,
                                                       **guarded))

    def list_files(self, sandbox_id: str, path: str, depth: int = 1) -> list[EntryInfo]:
        path = validate.path(path)
        depth = validate.positive(depth, "depth", allow_none=False, integer=True, maximum=64)
        return [_entry(e) for e in self.call(sandbox_id, lambda g: g.list(path, depth=depth))]

    def stat(self, sandbox_id: str, path: str) -> EntryInfo:
        path = validate.path(path)
        return _entry(self.call(sandbox_id, lambda g: g.stat(path)))

    def exists(self, sandbox_id: str, path: str) -> bool:
        path = validate.path(path)
        return self.call(sandbox_id, lambda g: g.exists(path))

    def make_dir(self, sandbox_id: str, path: str, user: str | None = None) -> None:
        path = validate.path(path)
        user = validate.user(user)
        self.call(sandbox_id, lambda g: g.mkdir(path, parents=True, user=user))

    def remove(self, sandbox_id: str, path: str) -> None:
        path = validate.path(path)
        self.call(sandbox_id, lambda g: g.remove(path, recursive=True))

    def rename(self, sandbox_id: str, src: str, dst: str) -> None:
        src = validate.path(src, "source path")
        dst = validate.path(dst, "destination path")
        self.call(sandbox_id, lambda g: g.rename(src, dst))

    def watch_dir(self, sandbox_id: str, path: str, recursive: bool = False,
                  timeout: float | None = None) -> WatchStream:
        path = validate.path(path)
        timeout = validate.positive(timeout, "timeout", maximum=MAX_WATCH_TIMEOUT)
        if not isinstance(recursive, bool):
            raise InvalidArgumentError(f"recursive must be true or false, got {recursive!r}")
        return self.call(sandbox_id, lambda g: g.watch(path, recursive, timeout=timeout))


def _argv_text(argv: list[str]) -> str:
    if len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"]:
        return argv[2]
    return shlex.join(argv)


def _command_result(result: ExecResult) -> CommandResult:
    return CommandResult(exit_code=result.exit_code, stdout=_decode(result.stdout),
                         stderr=_decode(result.stderr), truncated=result.truncated,
                         timed_out=result.timed_out, pid=result.pid)


def _guest_model(build: Callable[[], Any]) -> Any:
    """A model from guest data; what does not fit is the guest misbehaving."""
    try:
        return build()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # pydantic's too
        raise GuestProtocolError(f"the guest sent a malformed record: {str(exc)[:200]}") from None


def _entry(raw: dict[str, Any]) -> EntryInfo:
    return _guest_model(lambda: EntryInfo(
        name=raw["name"], path=raw["path"], type=raw["type"], size=raw["size"],
        mode=raw["mode"], mtime=raw["mtime"], symlink_target=raw.get("target"),
        owner=raw.get("owner") or "", group=raw.get("group") or "",
        version=_version(raw.get("version")), resolved_target=raw.get("resolved"),
        target_type=raw.get("target_type"), metadata=raw.get("metadata")))


def _version(value: Any) -> str | None:
    try:
        return validate.version(value)
    except InvalidArgumentError:
        raise GuestProtocolError("the guest sent an invalid file version") from None


def _process(raw: dict[str, Any]) -> ProcessInfo:
    return _guest_model(lambda: ProcessInfo(
        pid=raw["pid"], cmd=_argv_text(raw["argv"]), running=raw["running"],
        exit_code=raw.get("exit_code"), started_at=raw.get("started_at", 0)))
