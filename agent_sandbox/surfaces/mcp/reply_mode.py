"""Each HTTP POST answered as one JSON body, or as an SSE stream only when it needs one.

The SDK's Streamable HTTP transport answers every request of a server the same way: an SSE
stream (its default) or one JSON body (``json_response=True``). A stream costs the server
about 2 ms of CPU per call more (a response task, event framing, a chunked body) and is only
needed when something goes out before the answer: here, progress notifications, sent only
for a request that carries a progress token. So each POST is answered

- as JSON when the client accepts ``application/json`` and either asks no progress or does
  not accept ``text/event-stream`` (MCP lets the server choose when a client accepts both);
- as SSE otherwise (the SDK's own behaviour, including its 406 for a bad Accept header).

``chosen(...)`` marks the choice for the asyncio task serving the POST; the transports the
SDK's session manager makes are ``ChoosingTransport`` (``install()``), which read it there.
Anywhere else (the session's message router, or a task the SDK might add) they behave as
the SDK built them. Only the answer is ever taken from a JSON request's queue: a stray
notification for it (it asked for none) is dropped instead of being sent as its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import mcp_types as types
from mcp.server import streamable_http_manager
from mcp.server.streamable_http import StreamableHTTPServerTransport

_choices: dict[asyncio.Task[Any], bool] = {}


def wants_json(accept: str | None, message: Any) -> bool:
    """Whether to answer this POST (``message``: its checked JSON-RPC body) as JSON."""
    types_ = {t.split(";")[0].strip().lower() for t in (accept or "").split(",")}
    json_ok = bool(types_ & {"application/json", "application/*", "*/*"})
    sse_ok = bool(types_ & {"text/event-stream", "text/*", "*/*"})
    if not json_ok:
        return False
    return not sse_ok or not _asks_progress(message)


def _asks_progress(message: Any) -> bool:
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and meta.get("progressToken") is not None


@contextlib.contextmanager
def chosen(as_json: bool) -> Iterator[None]:
    """Answer the POST this task is serving as JSON (True) or SSE (False)."""
    task = asyncio.current_task()
    if task is None:
        yield
        return
    _choices[task] = as_json
    try:
        yield
    finally:
        _choices.pop(task, None)


def _choice() -> bool | None:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        return None
    return None if task is None else _choices.get(task)


class _AnswerOnly:
    """A JSON request's queue as the transport reads it: its answer, nothing else."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def receive(self) -> Any:
        while True:
            event = await self._inner.receive()
            if isinstance(event.message, types.JSONRPCResponse | types.JSONRPCError):
                return event

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _RequestStreams(dict):  # type: ignore[type-arg]
    def __setitem__(self, key: Any, value: Any) -> None:
        if _choice():  # the transport is opening a JSON request's queue
            value = (value[0], _AnswerOnly(value[1]))
        super().__setitem__(key, value)


class ChoosingTransport(StreamableHTTPServerTransport):
    """The SDK transport, answering JSON or SSE per request (see ``chosen``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_streams = _RequestStreams()

    @property  # type: ignore[override]
    def is_json_response_enabled(self) -> bool:
        choice = _choice()
        return self._json_by_default if choice is None else choice

    @is_json_response_enabled.setter
    def is_json_response_enabled(self, value: bool) -> None:
        self._json_by_default = value


def install() -> None:
    """Make the SDK's session manager build ``ChoosingTransport`` (idempotent; without a
    choice made by ``chosen`` it behaves exactly as the SDK's transport)."""
    streamable_http_manager.StreamableHTTPServerTransport = ChoosingTransport  # type: ignore[misc]
