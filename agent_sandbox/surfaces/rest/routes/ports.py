"""/v1/sandboxes/{id}/ports/{port}/...: a server listening inside a sandbox, reached
through the gateway behind the same API key as the rest (HTTP, streamed both ways; and
WebSockets). The engine forwards the port through the guest channel (runtime/
port_forward.py), so this works with the sandbox's network off.

The caller's credentials never reach the sandbox: Authorization, cookies of the gateway
and hop-by-hop headers are dropped; what comes back is relayed, never interpreted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio.to_thread
import httpx2 as httpx
import websockets
from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.validate import port as check_port
from agent_sandbox.surfaces.http.auth import check_sandbox, principal
from agent_sandbox.surfaces.http.errors import sandbox_error_response
from agent_sandbox.surfaces.rest.routes.deps import SandboxId, State

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}/ports", tags=["ports"])
tcp_router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}/tcp", tags=["ports"])
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "authorization", "cookie",
        "content-length"}
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_client: httpx.AsyncClient | None = None


def _http() -> httpx.AsyncClient:
    global _client
    if _client is None:  # one pool for every forwarded request of this process
        _client = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=15.0),
                                    limits=httpx.Limits(max_connections=None,
                                                        max_keepalive_connections=64),
                                    follow_redirects=False, trust_env=False)
    return _client


async def exposed(state: State, sandbox_id: str, port: int) -> str:
    """The engine's URL of ``port`` inside the sandbox (a paused one is resumed)."""
    return await _forwarded(state, sandbox_id, port)


async def _forwarded(state: State, sandbox_id: str, port: int) -> str:
    check_port(port)
    return await anyio.to_thread.run_sync(state.provider.expose_port, sandbox_id, port)


@router.api_route("/{port}/{path:path}", methods=_METHODS, include_in_schema=False)
async def forward_http(sandbox_id: SandboxId, port: int, path: str, request: Request,
                       state: State) -> StreamingResponse:
    """Any HTTP request, to ``port`` inside the sandbox, as ``/{path}``. Not in the
    OpenAPI document: what answers is the sandbox's server, not this API."""
    return await forward(state, sandbox_id, port, path, request,
                         prefix=f"/v1/sandboxes/{sandbox_id}/ports/{port}")


async def forward(state: State, sandbox_id: str, port: int, path: str, request: Request, *,
                  prefix: str | None, cookie: str | None = None) -> StreamingResponse:
    """``request`` relayed to ``port`` inside the sandbox as ``/{path}`` (streamed both
    ways), without the caller's credentials: ``cookie`` is the Cookie header to send (the
    caller's own minus the gateway's), ``prefix`` the X-Forwarded-Prefix (None: none)."""
    base = await _forwarded(state, sandbox_id, port)
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
    length = request.headers.get("content-length")
    if length is not None and length.isdigit():  # kept: not every server reads chunks
        headers.append(("content-length", length))
    if prefix is not None:
        headers.append(("x-forwarded-prefix", prefix))
    if cookie:
        headers.append(("cookie", cookie))
    url = f"{base}/{path}" + (f"?{request.url.query}" if request.url.query else "")
    upstream = _http().build_request(request.method, url, headers=headers,
                                     content=request.stream())
    try:
        reply = await _http().send(upstream, stream=True)
    except httpx.HTTPError as exc:
        return StreamingResponse(iter([f"nothing answered on port {port} inside the sandbox "
                                       f"({type(exc).__name__})\n".encode()]),
                                 status_code=502, media_type="text/plain")
    out = [(k, v) for k, v in reply.headers.multi_items() if k.lower() not in _HOP - {"cookie"}]
    response = StreamingResponse(reply.aiter_raw(), status_code=reply.status_code,
                                 background=BackgroundTask(reply.aclose))
    for k, v in out:  # every Set-Cookie of the app, not the last one only
        response.headers.append(k, v)
    return response


@router.websocket("/{port}/{path:path}")
async def forward_websocket(websocket: WebSocket, sandbox_id: str, port: int,
                            path: str) -> None:
    """A WebSocket to ``port`` inside the sandbox: messages relayed both ways."""
    state = websocket.app.state.gateway
    try:
        who = principal(websocket)  # type: ignore[arg-type]
        check_sandbox(state, who, sandbox_id, websocket)
        base = await _forwarded(state, sandbox_id, port)
    except SandboxError as exc:
        await websocket.close(code=4000 + min(exc.http_status, 999) % 1000,
                              reason=exc.message[:120])
        return
    await relay_websocket(websocket, base, port, path)


async def relay_websocket(websocket: WebSocket, base: str, port: int, path: str,
                          headers: list[tuple[str, str]] | None = None,
                          until: Callable[[], Awaitable[str]] | None = None) -> None:
    """``websocket`` (not yet accepted) relayed to ``base`` (an exposed port's URL) as
    ``/{path}``, with ``headers`` (e.g. the app's own cookies) on its opening request;
    cut (closed with 1008 and the reason it gives) when ``until`` returns."""
    url = "ws" + base[4:] + f"/{path}" + (f"?{websocket.url.query}" if websocket.url.query
                                           else "")
    try:
        # What the server inside sends is held here: a message at most 4 MiB, two ahead.
        async with websockets.connect(url, max_size=4 << 20, max_queue=2, open_timeout=15,
                                      additional_headers=headers or None) as inner:
            await websocket.accept()
            await _relay(websocket, inner, until)
    except (TimeoutError, OSError, websockets.WebSocketException):
        with contextlib.suppress(RuntimeError):
            await websocket.close(code=1011, reason=f"nothing answered on port {port}")


@tcp_router.websocket("/{port}")
async def forward_tcp(websocket: WebSocket, sandbox_id: str, port: int) -> None:
    """Plain TCP to ``port`` inside the sandbox, as binary WebSocket messages both ways
    (``abx sandbox port`` through a gateway)."""
    state = websocket.app.state.gateway
    try:
        who = principal(websocket)  # type: ignore[arg-type]
        check_sandbox(state, who, sandbox_id, websocket)
        host, _, number = (await _forwarded(state, sandbox_id, port))[7:].partition(":")
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(number)), 15)
    except SandboxError as exc:
        await websocket.close(code=4000 + exc.http_status % 1000, reason=exc.message[:120])
        return
    except (OSError, TimeoutError):
        await websocket.close(code=1011, reason=f"nothing answered on port {port}")
        return
    await websocket.accept()

    async def inward() -> None:
        """Until the client goes; an empty message is its EOF (TCP's half-close)."""
        with contextlib.suppress(WebSocketDisconnect, OSError):
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("bytes") or (message.get("text") or "").encode()
                if data:
                    writer.write(data)
                    await writer.drain()
                elif writer.can_write_eof():
                    writer.write_eof()

    async def outward() -> None:
        with contextlib.suppress(OSError, RuntimeError, WebSocketDisconnect):
            while data := await reader.read(64 * 1024):
                await websocket.send_bytes(data)

    tasks = [asyncio.ensure_future(inward()), asyncio.ensure_future(outward())]
    try:  # over when the server inside is done, or the client went away
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        writer.close()
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await websocket.close()


async def _relay(outer: WebSocket, inner: websockets.ClientConnection,
                 until: Callable[[], Awaitable[str]] | None = None) -> None:
    async def inward() -> None:
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                message = await outer.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("bytes")
                await inner.send(data if data is not None else message.get("text") or "")

    async def outward() -> None:
        async for data in _messages(inner):
            if isinstance(data, bytes):
                await outer.send_bytes(data)
            else:
                await outer.send_text(data)

    tasks = [asyncio.ensure_future(inward()), asyncio.ensure_future(outward())]
    cut = asyncio.ensure_future(until()) if until is not None else None
    why = ""
    try:
        await asyncio.wait([*tasks, *([cut] if cut else [])],
                           return_when=asyncio.FIRST_COMPLETED)
        if cut is not None and cut.done() and not cut.cancelled() and not cut.exception():
            why = cut.result()
    finally:
        for task in [*tasks, *([cut] if cut else [])]:
            task.cancel()
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await (outer.close(code=1008, reason=why[:120]) if why else outer.close())


async def _messages(inner: websockets.ClientConnection) -> AsyncIterator[str | bytes]:
    with contextlib.suppress(websockets.ConnectionClosed):
        async for data in inner:
            yield data


__all__ = ["exposed", "forward", "relay_websocket", "router", "sandbox_error_response"]
