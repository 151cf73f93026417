"""Bridges between the engine's blocking, callback-driven calls and ASGI streams."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from fastapi.responses import JSONResponse, StreamingResponse

from agent_sandbox.core import validate
from agent_sandbox.core.cancel import CallCancel
from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.models import CommandResult
from agent_sandbox.surfaces.http.errors import log, sandbox_error_response
from agent_sandbox.surfaces.http.event_queue import EventQueue

OutputCallback = Callable[[str], None]
RunFn = Callable[[OutputCallback, OutputCallback], CommandResult]
Emit = Callable[[dict[str, Any]], None]
# Does the work, emitting events as it goes; returns the last event.
WorkFn = Callable[[Emit], dict[str, Any]]
NDJSON = "application/x-ndjson"
_DONE = object()


class _Failure:
    """The work raised: an ``error`` event, or the response's status if it came first."""

    def __init__(self, exc: SandboxError) -> None:
        self.exc = exc


class _Pump:
    """Runs ``work`` in a thread, its events going through a bounded queue: the worker
    blocks when the client reads slowly, so output is never piled up in the gateway. Once
    the client is gone (it disconnected, or cancelled), the work is cancelled as an MCP
    call is (``agent_sandbox.core.cancel``): a foreground command is killed, a code cell
    interrupted, a wait just ends; the events left are dropped. ``slot`` (a quota) is held
    until the work has ended."""

    def __init__(self, work: WorkFn, slot: AbstractContextManager[Any] | None) -> None:
        # Bounded in bytes too: an event may carry a whole frame of the sandbox's output
        # (up to 1 MiB), and 32 of them let each unread stream pin 32 MiB.
        self.events = EventQueue()
        self.gone = threading.Event()
        self.call = CallCancel()
        self._work = work
        self._slot = slot
        threading.Thread(target=self._run, name="abx-gw-stream", daemon=True).start()

    def put(self, event: Any) -> None:
        while not self.gone.is_set():
            try:
                self.events.put(event, timeout=0.5)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        try:
            self.put(self.call.run(self._work, self.put))
        except SandboxError as exc:
            self.put(_Failure(exc))
        except Exception as exc:  # noqa: BLE001 - becomes an error event, not a hang
            log.exception("streamed call failed")
            self.put(_Failure(SandboxError(f"internal error: {type(exc).__name__}")))
        finally:
            if self._slot is not None:
                self._slot.__exit__(None, None, None)
            self.put(_DONE)

    async def next(self) -> Any:
        # Abandoned when the request is cancelled (the client went away while the work
        # was silent); ``leave`` then wakes the thread left waiting.
        return await anyio.to_thread.run_sync(self.events.get, abandon_on_cancel=True)

    def leave(self, finished: bool) -> None:
        """The client is gone: cancel the work if it is still going; drop its events."""
        self.gone.set()
        if not finished:
            self.call.cancel()
        with contextlib.suppress(queue.Full):
            self.events.put_nowait(_DONE)

    async def lines(self, first: Any = None) -> AsyncIterator[bytes]:
        finished = False
        try:
            event = first if first is not None else await self.next()
            while event is not _DONE:
                if isinstance(event, _Failure):
                    event = {"error": event.exc.to_dict()}
                yield json.dumps(event).encode() + b"\n"
                event = await self.next()
            finished = True
        finally:
            self.leave(finished)


async def work_events(work: WorkFn, slot: AbstractContextManager[Any] | None = None
                      ) -> AsyncIterator[dict[str, Any]]:
    """``work``'s events as they come, its return value last; a failure is raised as its
    SandboxError. Bounded like every stream here; a consumer that stops early cancels the
    work."""
    pump = _Pump(work, slot)
    finished = False
    try:
        while (event := await pump.next()) is not _DONE:
            if isinstance(event, _Failure):
                finished = True
                raise event.exc
            yield event
        finished = True
    finally:
        pump.leave(finished)


def ndjson_events(run: RunFn,
                  slot: AbstractContextManager[Any] | None = None) -> AsyncIterator[bytes]:
    """NDJSON lines: ``{"stdout": ...}`` / ``{"stderr": ...}`` while ``run`` goes, then
    ``{"result": {...}}`` or ``{"error": {code, message, details}}``."""

    def work(emit: Emit) -> dict[str, Any]:
        result = run(lambda t: emit({"stdout": t}), lambda t: emit({"stderr": t}))
        return {"result": result.model_dump()}

    return _Pump(work, slot).lines()


async def ndjson_response(work: WorkFn, slot: AbstractContextManager[Any] | None = None
                          ) -> StreamingResponse | JSONResponse:
    """An NDJSON stream of ``work``'s events, its status held back until the first event:
    a failure before any output (bad argument, unknown context...) answers with its own
    HTTP status and error body; a later one is an ``{"error": ...}`` event."""
    pump = _Pump(work, slot)
    first = await pump.next()
    if isinstance(first, _Failure):
        pump.leave(finished=True)
        return sandbox_error_response(first.exc)
    return StreamingResponse(pump.lines(first), media_type=NDJSON,
                             headers={"X-Accel-Buffering": "no"})


def request_chunks(body: AsyncIterator[bytes], batch: int = 1 << 20) -> Iterator[bytes]:
    """An ASGI request body as a blocking iterator, pulled from a worker thread (started by
    anyio.to_thread): a 1 GiB upload is never held whole. The server's small body pieces
    (~64 KiB) are joined up to ``batch`` bytes per hop to the event loop, which makes the
    hops (not the bytes) cheap enough to not be the bottleneck."""
    ended = False

    async def pull() -> bytes:
        nonlocal ended
        parts: list[bytes] = []
        size = 0
        while size < batch:
            try:
                chunk = await body.__anext__()
            except StopAsyncIteration:
                ended = True
                break
            parts.append(chunk)
            size += len(chunk)
        return b"".join(parts)

    while not ended:
        chunk = anyio.from_thread.run(pull)
        if chunk:
            yield chunk


METADATA_HEADER = "x-metadata-"  # E2B's upload headers: X-Metadata-<key>: <value>


def metadata_headers(headers: Mapping[str, str]) -> dict[str, str] | None:
    """A file's metadata from an upload's ``X-Metadata-<key>`` headers (E2B's, and our
    REST API's), checked (``core.file_metadata``); None when there are none."""
    found = {k[len(METADATA_HEADER):]: v for k, v in headers.items()
             if k.lower().startswith(METADATA_HEADER)}
    return validate.file_metadata(found)
