"""/v1/sandboxes/{id}/pty: terminals over a WebSocket (authenticated as REST is: an API
key in ``Authorization: Bearer``, or the daemon's peer credentials), and their kill.

The first client message (JSON text) opens one: ``{"cols", "rows", "cwd", "envs",
"cmd"}`` for a new terminal, ``{"pid": N}`` to attach to a running one; the answer is
``{"pid": N}``. Then binary messages carry output (to the client) and keystrokes (from
it); text ``{"resize": [cols, rows]}`` or ``{"kill": signal}`` from the client control
it; ``{"exit_code": N}`` (or ``{"error": {...}}``) ends it and the socket closes. A
client that goes away only detaches: the terminal keeps running.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from agent_sandbox.core.errors import InvalidArgumentError, SandboxError, SandboxTimeoutError
from agent_sandbox.core.pty import PtySession
from agent_sandbox.surfaces.http.auth import check_sandbox, principal
from agent_sandbox.surfaces.http.errors import log, sandbox_error_response
from agent_sandbox.surfaces.rest.routes.commands import Pid
from agent_sandbox.surfaces.rest.routes.deps import SandboxId, State
from agent_sandbox.surfaces.rest.schemas import Killed, KillProcess

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}", tags=["terminals"])
FIRST_TIMEOUT = 30.0  # for the client's first message
QUEUE = 16  # messages on their way to a client before the terminal's output waits
_OPEN_KEYS = {"pid", "cols", "rows", "cwd", "envs", "cmd", "user"}


@router.post("/pty/{pid}/kill")
def kill_terminal(sandbox_id: SandboxId, pid: Pid, body: KillProcess, state: State) -> Killed:
    return Killed(killed=state.provider.pty_kill(sandbox_id, pid, int(body.signal)))


def _open_arguments(message: dict[str, Any]) -> dict[str, Any]:
    text = message.get("text")
    try:
        args = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        args = None
    if not isinstance(args, dict) or not set(args) <= _OPEN_KEYS:
        raise InvalidArgumentError(
            "the first message must be a JSON object with the terminal to open "
            '({"cols": 80, "rows": 24, "cwd": ..., "envs": ..., "cmd": ...}) or '
            '{"pid": N} to attach to a running one')
    return args


class _Outbox:
    """Messages from the terminal's reader thread to the WebSocket, in order, through a
    bounded queue: the terminal's output waits while the client reads slowly."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[bytes | dict[str, Any] | None] = asyncio.Queue(QUEUE)
        self.gone = threading.Event()
        self.opened = threading.Event()  # the answer to the first message is queued

    def put_output(self, data: bytes) -> None:
        self.opened.wait()
        self.put(data)

    def put(self, item: bytes | dict[str, Any] | None) -> None:
        """From a thread; raises once the client is gone (the terminal then detaches)."""
        while not self.gone.is_set():
            future = asyncio.run_coroutine_threadsafe(self.queue.put(item), self.loop)
            try:
                future.result(0.5)
                return
            except concurrent.futures.TimeoutError:
                if not future.cancel():
                    return  # it went in as the wait ended
        raise ConnectionError("the terminal's client has gone")

    async def send_all(self, websocket: WebSocket) -> None:
        try:
            while (item := await self.queue.get()) is not None:
                if isinstance(item, bytes):
                    await websocket.send_bytes(item)
                else:
                    await websocket.send_text(json.dumps(item))
            await websocket.close()
        except Exception:  # noqa: BLE001 - the client has gone: it detached
            self.gone.set()


async def _control(websocket: WebSocket, session: PtySession, state: Any,
                   sandbox_id: str) -> None:
    """The client's keystrokes and controls, until it disconnects. Failures here (the
    terminal ended meanwhile) are not reported: how it ended is, by ``_final``."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        try:
            data = message.get("bytes")
            if data:
                await anyio.to_thread.run_sync(session.send_input, data)
                continue
            try:
                event = json.loads(message.get("text") or "null")
            except ValueError:
                event = None
            if not isinstance(event, dict):
                continue
            size = event.get("resize")
            if isinstance(size, list) and len(size) == 2:
                await anyio.to_thread.run_sync(session.resize, size[0], size[1])
            sig = event.get("kill")
            if sig is not None:
                await anyio.to_thread.run_sync(state.provider.pty_kill, sandbox_id,
                                               session.pid, sig)
        except SandboxError:
            continue


async def _open(websocket: WebSocket, state: Any, sandbox_id: str,
                outbox: _Outbox) -> PtySession | None:
    """The terminal the client's first message asks for (None: it left first)."""
    try:
        with anyio.fail_after(FIRST_TIMEOUT):
            message = await websocket.receive()
    except TimeoutError:
        raise SandboxTimeoutError("no terminal was asked for within "
                                  f"{FIRST_TIMEOUT:g}s of connecting") from None
    if message["type"] == "websocket.disconnect":
        return None
    args = _open_arguments(message)
    pid = args.pop("pid", None)
    try:
        session: PtySession = await anyio.to_thread.run_sync(
            lambda: state.provider.pty_open(sandbox_id, pid, on_data=outbox.put_output,
                                            **args))
        await outbox.queue.put({"pid": session.pid})  # before any output
    finally:
        outbox.opened.set()
    return session


@router.websocket("/pty")
async def terminal(websocket: WebSocket, sandbox_id: str) -> None:
    state = websocket.app.state.gateway
    try:
        who = await anyio.to_thread.run_sync(principal, websocket)
        await anyio.to_thread.run_sync(check_sandbox, state, who, sandbox_id, websocket)
        with state.quotas.terminal_slot(who.key):
            await websocket.accept()
            await _serve(websocket, state, sandbox_id)
    except SandboxError as exc:  # before the accept: the answer to the handshake
        await websocket.send_denial_response(sandbox_error_response(exc))


async def _serve(websocket: WebSocket, state: Any, sandbox_id: str) -> None:
    outbox = _Outbox(asyncio.get_running_loop())
    sender = asyncio.create_task(outbox.send_all(websocket))
    session: PtySession | None = None
    try:
        try:
            session = await _open(websocket, state, sandbox_id, outbox)
        except SandboxError as exc:
            error = exc
        except Exception:  # noqa: BLE001 - an error message, not a dropped socket
            log.exception("opening a terminal failed")
            error = SandboxError("internal error opening the terminal")
        else:
            if session is not None:
                # In a thread of its own: a terminal that ended already calls this at
                # once, here, on the event loop that _final waits for.
                session.on_end(lambda: threading.Thread(
                    target=_final, args=(session, outbox), daemon=True).start())
                await _control(websocket, session, state, sandbox_id)
            return
        await outbox.queue.put({"error": error.to_dict()})
        await outbox.queue.put(None)
        await asyncio.wait_for(asyncio.shield(sender), 10)
    except (WebSocketDisconnect, TimeoutError):
        pass
    finally:
        outbox.gone.set()
        if session is not None:
            await anyio.to_thread.run_sync(session.close)  # detach; the terminal goes on
        # Done unless the client left first (detached): then nothing is left to send.
        sender.cancel()


def _final(session: PtySession, outbox: _Outbox) -> None:
    """In the reader thread, after the last output: how the terminal ended."""
    try:
        session.wait(0)
        event: dict[str, Any] = {"exit_code": session.exit_code}
    except SandboxError as exc:
        if session.closed:
            return  # detached on purpose: the client has gone
        event = {"error": exc.to_dict()}
    try:
        outbox.put(event)
        outbox.put(None)
    except ConnectionError:
        pass
