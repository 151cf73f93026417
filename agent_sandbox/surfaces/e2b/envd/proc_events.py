"""A process's life as envd's ``ProcessEvent`` stream: its output (stdout/stderr, or a
terminal's bytes) as it comes, then its end; KeepAlive events while it is silent.

Output goes out in events of at most ``DATA_MAX`` bytes, through
``streaming.work_events`` (a queue bounded in bytes): a client that does not read makes
the process's output wait (in the sandbox, and then the process itself), never pile up
here. The keepalives are what lets the gateway see a client that went away from a silent
process (Connect servers notice a disconnect only when they write), so the thread
following it does not wait forever."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof

from agent_sandbox.core import cancel
from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.provider import Provider
from agent_sandbox.core.pty import PtySession
from agent_sandbox.surfaces.e2b import target
from agent_sandbox.surfaces.e2b.envd.errors import connect_error, unexpected
from agent_sandbox.surfaces.e2b.envd_pb.process import process_pb as pb
from agent_sandbox.surfaces.http.streaming import Emit, WorkFn, work_events

KEEPALIVE_HEADER = "keepalive-ping-interval"  # seconds, from E2B's SDKs (they send 50)
# At most this long between events: how soon a client gone from a silent process is
# noticed (and its gateway thread freed). More often than the SDKs ask is harmless.
MAX_KEEPALIVE = 15.0
MIN_KEEPALIVE = 1.0
DATA_MAX = 64 << 10  # bytes of output per event (a sandbox's frame is up to 1 MiB)
Event = pb.ProcessEvent


def keepalive_interval(ctx: RequestContext[Any, Any]) -> float:
    text = ctx.request_headers.get(KEEPALIVE_HEADER, "")
    try:
        asked = float(text[:12]) if text else MAX_KEEPALIVE
    except ValueError:
        asked = MAX_KEEPALIVE
    if math.isnan(asked):
        asked = MAX_KEEPALIVE
    return min(max(asked, MIN_KEEPALIVE), MAX_KEEPALIVE)


def start_event(pid: int) -> Event:
    return Event(event=Oneof("start", Event.StartEvent(pid=pid)))


def end_event(exit_code: int) -> Event:
    # Our exit codes are 128+N for a signal N: envd's "exited" and "signal: ..." status
    # cannot be told from them, so every end reads as an exit with that code.
    return Event(event=Oneof("end", Event.EndEvent(exit_code=exit_code, exited=True,
                                                   status=f"exit status {exit_code}")))


def _data(kind: str, data: bytes) -> Event:
    return Event(event=Oneof("data", Event.DataEvent(output=Oneof(kind, data))))


_KEEPALIVE = Event(event=Oneof("keepalive", Event.KeepAlive()))


def pieces(data: bytes) -> Iterator[bytes]:
    """``data`` in pieces of at most DATA_MAX bytes, cut between UTF-8 characters (a
    client that decodes each event alone sees whole characters; any other bytes are cut
    at DATA_MAX)."""
    view = memoryview(data)
    while len(view) > DATA_MAX:
        cut = DATA_MAX
        while cut > DATA_MAX - 3 and view[cut] & 0xC0 == 0x80:  # a continuation byte
            cut -= 1
        if view[cut] & 0xC0 == 0x80:
            cut = DATA_MAX  # not UTF-8 there
        yield bytes(view[:cut])
        view = view[cut:]
    if view:
        yield bytes(view)


def _emit_text(emit: Emit, kind: str, text: str) -> None:
    """Text as events of bytes, a window at a time: a frame's output is never held
    here twice over."""
    for start in range(0, len(text), DATA_MAX):
        for piece in pieces(text[start:start + DATA_MAX].encode()):
            emit({kind: piece})


def wait_work(provider: Provider, sandbox_id: str, pid: int) -> WorkFn:
    """Follow a process: its output so far (the sandbox keeps a bounded tail), then as it
    comes, then its exit code. The provider hands output over as text: bytes that are not
    UTF-8 arrive as U+FFFD."""
    def work(emit: Emit) -> dict[str, Any]:
        result = provider.wait(sandbox_id, pid,
                               on_stdout=lambda text: _emit_text(emit, "stdout", text),
                               on_stderr=lambda text: _emit_text(emit, "stderr", text))
        return {"end": result.exit_code}
    return work


def run_work(provider: Provider, sandbox_id: str, cmd: str, *, cwd: str,
             envs: dict[str, str], user: str,
             on_start: Callable[[int], None]) -> WorkFn:
    """Start a command and follow it from its very start (all of its output, not the
    tail a later wait gets): its pid first (``on_start`` is told, in the worker thread,
    before the client is), its output as it comes, its exit code. It is detached: a
    client that goes away leaves it running."""

    def work(emit: Emit) -> dict[str, Any]:
        def started(pid: int) -> None:
            on_start(pid)
            emit({"pid": pid})

        result = provider.run(sandbox_id, cmd, cwd=cwd, envs=envs, user=user,
                              on_stdout=lambda text: _emit_text(emit, "stdout", text),
                              on_stderr=lambda text: _emit_text(emit, "stderr", text),
                              on_start=started, detach=True)
        return {"end": result.exit_code}

    return work


def pty_work(open_session: Callable[[Callable[[bytes], None]], PtySession],
             on_open: Callable[[PtySession], None]) -> WorkFn:
    """Start (or attach to) a terminal: its pid first (``on_open`` is told, before any of
    its output goes out), its bytes as they come, its exit code. The attachment detaches
    when the client goes (the terminal keeps running)."""
    def work(emit: Emit) -> dict[str, Any]:
        opened = threading.Event()

        def on_data(data: bytes) -> None:
            opened.wait()
            for piece in pieces(data):
                emit({"pty": piece})

        try:
            session = open_session(on_data)
            on_open(session)
            emit({"pid": session.pid})
        finally:
            opened.set()
        call = cancel.current()
        if call is not None:
            call.register(session.close)
        return {"end": session.wait()}
    return work


async def stream_error(exc: SandboxError) -> ConnectError:
    """A stream's failure as envd's: when its sandbox is gone (killed, or at its end) or no
    longer running, UNAVAILABLE as envd's connection ending says it, on which the SDKs ask
    the sandbox's health (502 here) and raise that it was killed (E2B's
    ``SandboxNotRunningException``, a ``TimeoutException``); otherwise the error itself."""
    found = target.current()
    running = await target.still_running(found)
    if running:
        return connect_error(exc)
    return ConnectError(Code.UNAVAILABLE, f"the connection to sandbox {found.sandbox_id} "
                        "ended before the stream completed")


async def events(work: WorkFn, interval: float) -> AsyncIterator[Event]:
    """``work``'s events as envd's, a KeepAlive after each ``interval`` seconds of
    silence; a failure is raised as a ConnectError."""
    source = work_events(work).__aiter__()
    pending: asyncio.Future[dict[str, Any]] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(source.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield _KEEPALIVE
                continue
            item, pending = pending, None
            try:
                event = item.result()
            except StopAsyncIteration:
                return
            if "end" in event:
                yield end_event(event["end"])
                return
            if "pid" in event:
                yield start_event(event["pid"])
            elif "pty" in event:
                yield _data("pty", event["pty"])
            else:
                kind = "stdout" if "stdout" in event else "stderr"
                yield _data(kind, event[kind])
    except ConnectError:
        raise
    except SandboxError as exc:
        raise await stream_error(exc) from None
    except Exception as exc:  # noqa: BLE001 - INTERNAL for the client, not a traceback
        raise unexpected(exc, "a process stream") from None
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await source.aclose()
