"""Bridges between the engine's blocking, callback-driven calls and ASGI streams."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread

from agent_sandbox.errors import SandboxError
from agent_sandbox.models import CommandResult
from agent_sandbox.server.errors import log

OutputCallback = Callable[[str], None]
RunFn = Callable[[OutputCallback, OutputCallback], CommandResult]
_DONE = object()


def ndjson_events(run: RunFn,
                  slot: AbstractContextManager[Any] | None = None) -> AsyncIterator[bytes]:
    """NDJSON lines: ``{"stdout": ...}`` / ``{"stderr": ...}`` while ``run`` goes, then
    ``{"result": {...}}`` or ``{"error": {code, message, details}}``.

    The worker blocks when the client reads slowly (a bounded queue), so output is never
    piled up in the gateway; once the client is gone, output is dropped and the command
    runs to its end (or its timeout). ``slot`` (a quota) is held until then.
    """
    events: queue.Queue[Any] = queue.Queue(maxsize=256)
    gone = threading.Event()

    def put(event: Any) -> None:
        while not gone.is_set():
            try:
                events.put(event, timeout=0.5)
                return
            except queue.Full:
                continue

    def work() -> None:
        try:
            result = run(lambda t: put({"stdout": t}), lambda t: put({"stderr": t}))
            put({"result": result.model_dump()})
        except SandboxError as exc:
            put({"error": exc.to_dict()})
        except Exception as exc:  # noqa: BLE001 - becomes an error event, not a hang
            log.exception("streamed command failed")
            put({"error": {"code": "internal", "message": f"internal error: "
                                                          f"{type(exc).__name__}",
                           "details": {}}})
        finally:
            if slot is not None:
                slot.__exit__(None, None, None)
            put(_DONE)

    threading.Thread(target=work, name="abx-gw-stream", daemon=True).start()

    async def lines() -> AsyncIterator[bytes]:
        try:
            while True:
                event = await anyio.to_thread.run_sync(events.get)
                if event is _DONE:
                    return
                yield json.dumps(event).encode() + b"\n"
        finally:
            gone.set()

    return lines()


def request_chunks(body: AsyncIterator[bytes]) -> Iterator[bytes]:
    """An ASGI request body as a blocking iterator, pulled chunk by chunk from a worker
    thread (started by anyio.to_thread): a 1 GiB upload is never held whole."""
    while True:
        try:
            chunk = anyio.from_thread.run(body.__anext__)
        except StopAsyncIteration:
            return
        if chunk:
            yield chunk
