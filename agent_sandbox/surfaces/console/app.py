"""The console's server side: its page and built assets under /ui, sign-in and out, and
what the REST API lacks for its operator pages (keys, host health, a sandbox's audit
trail). Everything else the page asks of the REST API itself, with its session cookie
(``guard``); what a key sees there is what its REST API shows."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from agent_sandbox.core.errors import (
    InvalidArgumentError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from agent_sandbox.surfaces.console.audit import RestAudit, sandbox_trail
from agent_sandbox.surfaces.console.guard import ConsoleSessions, same_origin
from agent_sandbox.surfaces.console.sessions import COOKIE, TTL, Sessions
from agent_sandbox.surfaces.http.auth import (
    Principal,
    authenticate,
    check_sandbox,
    presented,
    require_admin,
)
from agent_sandbox.surfaces.http.state import GatewayState
from agent_sandbox.surfaces.rest.routes.deps import Caller, State

STATIC = Path(__file__).parent / "static"
# The page loads only its own files; a sandbox's bytes are shown as text or as a blob
# image, never as markup; no other site may frame it.
PAGE_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
               "img-src 'self' blob: data:; connect-src 'self'; object-src 'none'; "
               "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": PAGE_POLICY, "X-Frame-Options": "DENY",
                "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-store"}

router = APIRouter(prefix="/ui", include_in_schema=False)


class Login(BaseModel):
    key: str = Field(min_length=1, max_length=400)


class NewKey(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    admin: bool = False
    max_sandboxes: int | None = Field(None, ge=0)
    max_commands: int | None = Field(None, ge=0)
    network: Any = Field(None, description="the key's network ceiling (none: the gateway's)")


def _sessions(request: Request) -> Sessions:
    return request.app.state.console_sessions


@router.get("")
def root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/")
def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)


@router.post("/api/login")
def login(request: Request, body: Login, state: State) -> JSONResponse:
    """The key, once, for a session cookie; the key itself is kept nowhere."""
    if request.headers.get("origin") is not None and not same_origin(request.headers):
        raise PermissionDeniedError("sign in from this gateway's own page")
    if not state.keys.any_keys():
        return JSONResponse({"open": True, "admin": True})
    who = authenticate(state.keys, body.key.strip())
    assert who.key is not None
    token, session = _sessions(request).open(who.key.id)
    reply = JSONResponse({"open": False, "admin": who.key.admin, "key": who.key.public(),
                          "csrf": session.csrf})
    reply.set_cookie(COOKIE, token, max_age=int(TTL), path="/", httponly=True,
                     samesite="strict", secure=request.url.scheme == "https")
    return reply


@router.post("/api/logout", status_code=204)
def logout(request: Request) -> Response:
    """Ends the session on the server: the cookie, wherever a copy is, opens nothing."""
    token = request.scope.get("abx.console")
    if token:
        _sessions(request).close(token)
    reply = Response(status_code=204)
    reply.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return reply


@router.get("/api/me")
def me(request: Request, state: State) -> dict[str, Any]:
    session_of = request.scope.get("abx.principal")
    who = session_of if isinstance(session_of, Principal) else presented(request)
    if who is None:
        raise UnauthenticatedError("sign in with an API key")
    token = request.scope.get("abx.console")
    session = _sessions(request).get(token) if token else None
    return {"open": who.key is None, "admin": who.admin,
            "key": who.key.public() if who.key else None,
            "csrf": session.csrf if session else None}


@router.get("/api/keys")
def list_keys(state: State, who: Caller) -> list[dict[str, object]]:
    require_admin(who)
    return [k.public() for k in state.keys.list()]


@router.post("/api/keys", status_code=201)
def create_key(body: NewKey, state: State, who: Caller) -> dict[str, object]:
    """A new key; its token is in this answer only."""
    require_admin(who)
    key, token = state.keys.create(body.name, admin=body.admin,
                                   max_sandboxes=body.max_sandboxes,
                                   max_commands=body.max_commands,
                                   network_ceiling=body.network or None)
    return {**key.public(), "token": token}


@router.delete("/api/keys/{key_id}")
def revoke_key(request: Request, key_id: str, state: State,
               who: Caller) -> dict[str, object]:
    require_admin(who)
    if not re.fullmatch(r"key-[0-9a-f]{1,64}", key_id):
        raise InvalidArgumentError(f"{key_id!r} is not a key id (key-...)")
    key = state.keys.revoke(key_id)
    _sessions(request).close_key(key.id)
    return key.public()


@router.get("/api/health")
def health(state: State, who: Caller) -> dict[str, Any]:
    """The host as an operator sees it: disk headroom, sandboxes by state, the warm pool
    and the lifecycle supervisor (where this engine has them)."""
    require_admin(who)
    from agent_sandbox.providers.local import engine_status

    states = Counter(i.state for i in state.provider.list())
    return {"status": "ok", "disk": state.provider.disk_headroom(),
            "sandboxes": dict(states), **(engine_status(state.provider) or {})}


@router.get("/api/sandboxes/{sandbox_id}/audit")
def audit(request: Request, sandbox_id: str, state: State, who: Caller) -> list[dict[str, Any]]:
    """What was done in this sandbox (MCP tool calls, REST calls), newest last."""
    check_sandbox(state, who, sandbox_id)
    return sandbox_trail(state.provider, sandbox_id, request.app.state.console_mcp_log)


def install(app: FastAPI, state: GatewayState, mcp_log: Path | None) -> None:
    """The console on a gateway app: its routes, its assets, the cookie's middleware
    (innermost: it runs right before routing, after the E2B front and the body cap) and
    the REST calls' audit records."""
    app.state.console_sessions = Sessions()
    app.state.console_mcp_log = mcp_log  # the MCP servers' tool calls (a trail's half)
    app.include_router(router)
    app.mount("/ui/assets", StaticFiles(directory=STATIC, check_dir=False), name="console")
    app.add_middleware(RestAudit, provider=state.provider)
    app.add_middleware(ConsoleSessions, keys=state.keys, sessions=app.state.console_sessions)

