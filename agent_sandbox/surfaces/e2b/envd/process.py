"""envd's Process service on the gateway's provider: start commands (and terminals) and
follow them (``Start``, ``Connect``), list them, type into them, signal them, close their
stdin, resize terminals.

What E2B's SDKs send and what it becomes here:

- the user (Basic auth; E2B's default ``user``) runs the process as that account of the
  sandbox: ``user`` (uid 1000, home /home/user, made on first use) and ``root`` are in
  every template; another name must be in the sandbox's /etc/passwd (NOT_FOUND
  otherwise). The default cwd is the user's home, as in E2B (``commands.run("pwd")`` is
  /home/user).
- ``cmd`` + ``args`` (the SDK's ``/bin/bash -l -c <command>``) run as given, through
  ``exec`` so the pid reported is the command's.
- a ``Start`` call's timeout (Connect's deadline; the SDK's ``timeout=``, 60 s unless 0)
  is the process's lifetime, as in envd: at the deadline it is killed. A client that
  only disconnects leaves it running (``Connect`` follows it again).
- ``Connect`` replays the output the sandbox still holds of the process (a bounded tail)
  before the new output: the handle's result has the whole output, not only what came
  after it attached.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, aclosing
from typing import Any

import anyio.to_thread
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof

from agent_sandbox.core.errors import NotFoundError, SandboxError
from agent_sandbox.surfaces.e2b import target
from agent_sandbox.surfaces.e2b.envd import codecs, paths
from agent_sandbox.surfaces.e2b.envd import proc_events as ev
from agent_sandbox.surfaces.e2b.envd import pty as terminals
from agent_sandbox.surfaces.e2b.envd.errors import blocking, connect_error
from agent_sandbox.surfaces.e2b.envd.registry import MAX_TAG, Record, Registry, kill_at
from agent_sandbox.surfaces.e2b.envd_pb.process import process_pb as pb
from agent_sandbox.surfaces.e2b.envd_pb.process.process_connect import (
    Process,
    ProcessASGIApplication,
)

Ctx = RequestContext[Any, Any]
_SIGNALS = {pb.Signal.SIGTERM: 15, pb.Signal.SIGKILL: 9}
MAX_ARGS = 4096


def _bad(message: str) -> ConnectError:
    return ConnectError(Code.INVALID_ARGUMENT, message)


def _record(found: target.Target, request: pb.StartRequest) -> Record:
    """The request checked: what to run, where, as whom (``pid`` 0 until started)."""
    config = request.process
    if config is None or not config.cmd:
        raise _bad("Start needs process.cmd: the program to run (e.g. /bin/bash with args "
                   "['-l', '-c', '<command>'])")
    args = list(config.args)
    if len(args) > MAX_ARGS or any("\x00" in a for a in [config.cmd, *args]):
        raise _bad(f"process.cmd and args must be at most {MAX_ARGS} strings without NUL "
                   "bytes")
    tag = request.tag if request.has_field("tag") else None
    if tag is not None and len(tag) > MAX_TAG:
        raise _bad(f"tag is longer than {MAX_TAG} characters")
    try:
        user = paths.username(found.user)
        cwd = paths.resolve(config.cwd, user, "cwd") if config.cwd else paths.home(user)
    except SandboxError as exc:
        raise connect_error(exc) from None
    return Record(found.sandbox_id, 0, config.cmd, args, dict(config.envs), cwd, user,
                  tag, pty=request.pty is not None)


def _shell(record: Record) -> str:
    return "exec " + shlex.join([record.cmd, *record.args])


class ProcessService(Process):
    def __init__(self) -> None:
        self.registry = Registry()

    # selectors ---------------------------------------------------------------------------
    def _find(self, found: target.Target, selector: pb.ProcessSelector | None
              ) -> tuple[int, Record | None]:
        """The pid a selector names (a tag must be one this gateway started), and what
        is known of it."""
        match selector.selector if selector is not None else None:
            case Oneof(field="pid", value=pid) if pid > 0:
                return pid, self.registry.get(found.sandbox_id, pid)
            case Oneof(field="tag", value=tag):
                record = self.registry.by_tag(found.sandbox_id, tag)
                if record is None:
                    raise ConnectError(Code.NOT_FOUND, f"no process tagged {tag[:80]!r} in "
                                       "this sandbox (commands.list() shows the running ones)")
                return record.pid, record
        raise _bad("name the process by pid (a positive number) or by tag")

    async def _slot(self, found: target.Target, terminal: bool) -> AbstractContextManager[Any]:
        """A quota slot of the sandbox's key, held while a stream follows a process (each
        holds a gateway thread): max_commands for commands, the terminal quota for ptys."""
        state = found.state

        api_key = await anyio.to_thread.run_sync(found.api_key)
        slot = (state.quotas.terminal_slot if terminal else state.quotas.command_slot)(api_key)
        try:
            slot.__enter__()
        except SandboxError as exc:
            raise connect_error(exc) from None
        return slot

    # streams -----------------------------------------------------------------------------
    def start(self, request: pb.StartRequest, ctx: Ctx) -> AsyncIterator[pb.StartResponse]:
        return self._start(request, ctx)

    async def _start(self, request: pb.StartRequest,
                     ctx: Ctx) -> AsyncIterator[pb.StartResponse]:
        found = target.current()
        record = _record(found, request)
        deadline = ctx.timeout_ms
        interval = ev.keepalive_interval(ctx)
        slot = await self._slot(found, terminal=record.pty)
        try:
            async with aclosing(self._follow_new(found, request, record, deadline,
                                                 interval)) as events:
                async for event in events:
                    yield pb.StartResponse(event=event)
        finally:
            slot.__exit__(None, None, None)
            record.session = None  # detached: input and resizes attach anew

    async def _follow_new(self, found: target.Target, request: pb.StartRequest,
                          record: Record, deadline: float | None,
                          interval: float) -> AsyncIterator[ev.Event]:
        provider, sid = found.provider, found.sandbox_id
        loop = asyncio.get_running_loop()

        def registered(pid: int) -> None:  # on the loop, before the client learns the pid
            record.pid = pid
            self.registry.add(record)
            if deadline is not None:
                kill_at(loop, record, deadline / 1000,
                        lambda: _kill_quietly(found, pid, record.pty))

        if record.pty:
            size = request.pty.size if request.pty is not None else None
            work = terminals.start_work(found, record, size, _shell(record))
        else:
            no_stdin = request.has_field("stdin") and not request.stdin

            def started(pid: int) -> None:  # in the worker thread, before any output
                if no_stdin:  # envd gives such a process no stdin
                    _close_stdin_now(found, pid)

            work = ev.run_work(provider, sid, _shell(record), cwd=record.cwd,
                               envs=record.envs, user=record.user, on_start=started)
        async with aclosing(ev.events(work, interval)) as events:
            async for event in events:
                match event.event:
                    case Oneof(field="start", value=started):
                        registered(started.pid)
                    case Oneof(field="end"):
                        self.registry.ended(sid, record.pid, record)
                        if record.timed_out:
                            # envd ends the call at its deadline: DEADLINE_EXCEEDED, the
                            # SDKs' TimeoutException (not the kill's exit code, 137).
                            raise ConnectError(Code.DEADLINE_EXCEEDED, "the command ran "
                                               f"past its timeout ({(deadline or 0) / 1000:g} s) "
                                               "and was killed")
                yield event

    def connect(self, request: pb.ConnectRequest, ctx: Ctx) -> AsyncIterator[pb.ConnectResponse]:
        return self._connect(request, ctx)

    async def _connect(self, request: pb.ConnectRequest,
                       ctx: Ctx) -> AsyncIterator[pb.ConnectResponse]:
        found = target.current()
        pid, record = self._find(found, request.process)
        interval = ev.keepalive_interval(ctx)
        pty = record is not None and record.pty
        if pty:
            work = terminals.attach_work(found, pid)
        else:
            await self._check_running(found, pid)
            work = ev.wait_work(found.provider, found.sandbox_id, pid)
        slot = await self._slot(found, terminal=pty)
        try:
            if not pty:
                yield pb.ConnectResponse(event=ev.start_event(pid))
            async with aclosing(ev.events(work, interval)) as events:
                async for event in events:
                    if event.event is not None and event.event.field == "end":
                        self.registry.ended(found.sandbox_id, pid, record)
                    yield pb.ConnectResponse(event=event)
        finally:
            slot.__exit__(None, None, None)

    async def _check_running(self, found: target.Target, pid: int) -> None:
        procs = await blocking(lambda: found.provider.processes(found.sandbox_id), "Connect")
        if not any(p.pid == pid and p.running for p in procs):
            raise ConnectError(Code.NOT_FOUND, f"no running process with pid {pid} in this "
                               "sandbox (it may have ended; commands.list() shows the "
                               "running ones)")

    # unary calls -------------------------------------------------------------------------
    async def list(self, request: pb.ListRequest, ctx: Ctx) -> pb.ListResponse:
        found = target.current()
        procs = await blocking(lambda: found.provider.processes(found.sandbox_id), "List")
        running = {p.pid: p for p in procs if p.running}
        self.registry.keep_only(found.sandbox_id, set(running))
        known = {r.pid: r for r in self.registry.of(found.sandbox_id)
                 if r.pid in running or (r.pty and not (r.session and r.session.ended))}
        out = [_info(known[pid]) if pid in known else pb.ProcessInfo(
            pid=pid, config=pb.ProcessConfig(cmd="/bin/sh", args=["-c", p.cmd]))
            for pid, p in running.items()]
        out += [_info(r) for pid, r in known.items() if pid not in running]
        return pb.ListResponse(processes=out)

    async def send_input(self, request: pb.SendInputRequest, ctx: Ctx) -> pb.SendInputResponse:
        found = target.current()
        pid, record = self._find(found, request.process)
        await self._input(found, pid, record, request.input)
        return pb.SendInputResponse()

    async def _input(self, found: target.Target, pid: int, record: Record | None,
                     given: pb.ProcessInput | None) -> None:
        match given.input if given is not None else None:
            case Oneof(field="pty", value=data):
                await terminals.call(found, pid, record, lambda s: s.send_input(data),
                                     "SendInput")
            case Oneof(field="stdin", value=data) if record is not None and record.pty:
                await terminals.call(found, pid, record, lambda s: s.send_input(data),
                                     "SendInput")
            case Oneof(field="stdin", value=data):
                await blocking(lambda: found.provider.send_stdin(found.sandbox_id, pid, data),
                               "SendInput")
            case _:
                raise _bad("SendInput needs input: stdin or pty bytes")

    async def stream_input(self, request: AsyncIterator[pb.StreamInputRequest],
                           ctx: Ctx) -> pb.StreamInputResponse:
        found = target.current()
        chosen: tuple[int, Record | None] | None = None
        async for message in request:
            match message.event:
                case Oneof(field="start", value=start):
                    chosen = self._find(found, start.process)
                case Oneof(field="data", value=data):
                    if chosen is None:
                        raise _bad("StreamInput must start with a start event naming the "
                                   "process")
                    await self._input(found, *chosen, data.input)
        return pb.StreamInputResponse()

    async def send_signal(self, request: pb.SendSignalRequest,
                          ctx: Ctx) -> pb.SendSignalResponse:
        found = target.current()
        pid, record = self._find(found, request.process)
        sig = _SIGNALS.get(request.signal)
        if sig is None:
            raise _bad("signal must be SIGTERM or SIGKILL")
        provider, sid = found.provider, found.sandbox_id

        def kill() -> bool:
            if record is not None and record.pty:
                return provider.pty_kill(sid, pid, sig)
            try:
                return provider.kill_process(sid, pid, sig)
            except NotFoundError:
                if record is not None:
                    raise
                return provider.pty_kill(sid, pid, sig)  # a terminal this gateway forgot

        if not await blocking(kill, "SendSignal"):
            raise ConnectError(Code.NOT_FOUND, f"process {pid} has already ended")
        return pb.SendSignalResponse()

    async def close_stdin(self, request: pb.CloseStdinRequest,
                          ctx: Ctx) -> pb.CloseStdinResponse:
        found = target.current()
        pid, record = self._find(found, request.process)
        if record is not None and record.pty:
            raise _bad(f"process {pid} runs on a terminal, which has no stdin to close: "
                       "send Ctrl+D (0x04) as its input instead")
        await blocking(lambda: found.provider.send_stdin(found.sandbox_id, pid, b"",
                                                         close=True), "CloseStdin")
        return pb.CloseStdinResponse()

    async def update(self, request: pb.UpdateRequest, ctx: Ctx) -> pb.UpdateResponse:
        found = target.current()
        pid, record = self._find(found, request.process)
        size = request.pty.size if request.pty is not None else None
        if size is None:
            raise _bad("Update needs pty.size (cols and rows): a terminal's new size")
        if record is not None and not record.pty:
            raise _bad(f"process {pid} was not started on a terminal (pty): only terminals "
                       "can be resized")
        await terminals.call(found, pid, record, lambda s: s.resize(size.cols, size.rows),
                             "Update")
        return pb.UpdateResponse()


def _info(record: Record) -> pb.ProcessInfo:
    return pb.ProcessInfo(pid=record.pid, tag=record.tag, config=pb.ProcessConfig(
        cmd=record.cmd, args=record.args, envs=record.envs, cwd=record.cwd))


def _close_stdin_now(found: target.Target, pid: int) -> None:
    """In a worker thread: the process may have ended already."""
    try:
        found.provider.send_stdin(found.sandbox_id, pid, b"", close=True)
    except SandboxError:
        pass


def _kill_quietly(found: target.Target, pid: int, pty: bool) -> None:
    """The deadline's kill (in a worker thread): the process may have ended already."""
    try:
        if pty:
            found.provider.pty_kill(found.sandbox_id, pid, 9)
        else:
            found.provider.kill_process(found.sandbox_id, pid, 9)
    except SandboxError:
        pass


def application() -> ProcessASGIApplication:
    return ProcessASGIApplication(ProcessService(), codecs=codecs.codecs())
