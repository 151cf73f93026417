"""The daemon's ``PeerGuard`` refuses a terminal's WebSocket as it refuses REST: a 403
with the JSON error saying why (so the client can say it), not a bare closed socket."""

from __future__ import annotations

import json
import os
from typing import Any

import anyio

from agent_sandbox.surfaces.http.peercred import PEER_STATE_KEY, PeerCred, PeerGuard


def _call(guard: PeerGuard, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    anyio.run(guard, scope, receive, send)
    return sent


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "websocket.accept"})


def _scope(uid: int, extensions: dict[str, Any]) -> dict[str, Any]:
    peer = PeerCred(pid=1, uid=uid, gid=uid, groups=())
    return {"type": "websocket", "extensions": extensions, "state": {PEER_STATE_KEY: peer}}


def test_a_refused_websocket_gets_the_reason() -> None:
    guard = PeerGuard(_app, "abx-no-such-group-here")
    stranger = 54321 if os.geteuid() != 54321 else 54322
    sent = _call(guard, _scope(stranger, {"websocket.http.response": {}}))
    assert [m["type"] for m in sent] == ["websocket.http.response.start",
                                        "websocket.http.response.body"]
    assert sent[0]["status"] == 403
    body = json.loads(sent[1]["body"])
    assert body["code"] == "permission_denied" and "abx-no-such-group-here" in body["message"]
    # A server without the denial extension: the socket is closed instead.
    assert _call(guard, _scope(stranger, {})) == [{"type": "websocket.close", "code": 1008}]


def test_an_allowed_peer_reaches_the_app() -> None:
    guard = PeerGuard(_app, "abx-no-such-group-here")
    assert _call(guard, _scope(os.geteuid(), {})) == [{"type": "websocket.accept"}]
