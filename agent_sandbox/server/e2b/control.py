"""E2B's control plane (``E2B_API_URL`` pointed at this gateway): create, get, list, kill,
timeout, pause, resume and connect, on the gateway's provider with the gateway's tenancy
and quotas. Keys are the gateway's (``X-API-KEY``). The shapes are E2B's OpenAPI
(spec/openapi.yml of e2b-dev/E2B); errors are its ``{code, message}``."""

from __future__ import annotations

import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent_sandbox import netpolicy
from agent_sandbox.errors import (
    InvalidArgumentError,
    NotFoundError,
    SandboxError,
    UnauthenticatedError,
)
from agent_sandbox.models import SandboxInfo
from agent_sandbox.server.auth import Principal, check_network, check_sandbox, principal
from agent_sandbox.server.e2b.tokens import AccessTokens
from agent_sandbox.server.errors import log
from agent_sandbox.server.state import GatewayState

# The envd API version this gateway answers as: no higher than the features of envd the
# SDKs gate on that server/e2b really serves (see docs/e2b.md).
ENVD_VERSION = "0.5.7"
MAX_TIMEOUT = 24 * 3600
MAX_BODY = 1 << 20  # bytes of a request body (a create's metadata and envVars: plenty)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class NetworkConfig(_Body):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    allow_out: list[str] | None = Field(None, alias="allowOut")
    deny_out: list[str] | None = Field(None, alias="denyOut")
    allow_internet_access: bool | None = None  # PUT .../network carries it here
    allow_public_traffic: bool | None = Field(None, alias="allowPublicTraffic")  # always
    # required here: a sandbox's ports need its access token or the API key

    def refuse_unsupported(self) -> None:
        """E2B's egress proxy, per-domain rules, DNS servers and host masks have no
        counterpart here: refused by name rather than silently dropped."""
        extra = sorted(k for k, v in (self.model_extra or {}).items() if v not in (None, {}, []))
        if extra:
            raise InvalidArgumentError(
                f"network option(s) {', '.join(extra)} are not supported by this gateway: "
                "use allowOut / denyOut (names, *.wildcards, CIDRs) or allow_internet_access "
                "(see docs/e2b.md)")


class NewSandbox(_Body):
    template_id: str = Field(alias="templateID", min_length=1, max_length=200)
    timeout: int = Field(15, ge=0, le=MAX_TIMEOUT)
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(None, alias="envVars")
    allow_internet_access: bool | None = None
    network: NetworkConfig | None = None


class Timeout(_Body):
    timeout: int = Field(ge=0, le=MAX_TIMEOUT)


class Resume(_Body):
    timeout: int = Field(0, ge=0, le=MAX_TIMEOUT)  # 0: keep the sandbox's own


def _gateway(request: Request) -> GatewayState:
    return request.app.state.gateway


def _tokens(request: Request) -> AccessTokens:
    return request.app.state.tokens


State = Annotated[GatewayState, Depends(_gateway)]
Tokens = Annotated[AccessTokens, Depends(_tokens)]
Caller = Annotated[Principal, Depends(principal)]
router = APIRouter()


def _time(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat().replace("+00:00", "Z")


def _sandbox(info: SandboxInfo, tokens: AccessTokens) -> dict[str, Any]:
    """E2B's ``Sandbox``: what the SDK needs to reach it (its access token included)."""
    token = tokens.for_sandbox(info.sandbox_id)
    return {"templateID": info.template, "sandboxID": info.sandbox_id, "alias": info.template,
            "clientID": "abx", "envdVersion": ENVD_VERSION, "envdAccessToken": token,
            "trafficAccessToken": token, "domain": None}


def _listed(info: SandboxInfo) -> dict[str, Any]:
    """E2B's ``ListedSandbox`` (and most of ``SandboxDetail``)."""
    limits = info.limits
    return {"templateID": info.template, "alias": info.template, "sandboxID": info.sandbox_id,
            "clientID": "abx", "startedAt": _time(info.created_at),
            "endAt": _time(info.expires_at), "cpuCount": max(1, round(limits.get("cpu") or 1)),
            "memoryMB": int(limits.get("memory_mb") or 0),
            "diskSizeMB": int(limits.get("disk_mb") or 0), "metadata": info.metadata,
            "state": "paused" if info.state == "paused" else "running",
            "envdVersion": ENVD_VERSION}


def _policy(body: NewSandbox) -> netpolicy.NetworkPolicy:
    """E2B's network options as our policy. Unlike E2B, no network unless asked:
    ``network.allowOut`` is an allowlist; ``allow_internet_access=True`` (or ``denyOut``
    alone) is ``full`` less ``denyOut``; nothing, or False, is ``off``."""
    return _policy_of(body.network, body.allow_internet_access)


def _policy_of(net: NetworkConfig | None, internet: bool | None) -> netpolicy.NetworkPolicy:
    if net is not None:
        net.refuse_unsupported()
    if net is not None and net.allow_out:
        # E2B's allowOut wins over its denyOut (typically 0.0.0.0/0, "all else"): with an
        # allowlist, all else is denied already, and what both name is allowed.
        return netpolicy.parse({"mode": "allowlist", "allow_out": net.allow_out})
    deny = (net.deny_out or []) if net is not None else []
    # Only denyOut (and the internet not refused) asks for the internet less those.
    if internet or (deny and internet is None):
        return netpolicy.parse({"mode": "full", "deny_out": deny})
    return netpolicy.parse("off")


@router.post("/sandboxes", status_code=201)
@router.post("/v2/sandboxes", status_code=201)
def create(body: NewSandbox, state: State, tokens: Tokens, who: Caller) -> dict[str, Any]:
    policy = _policy(body)
    check_network(state, who, policy)
    engine = state.provider

    def live() -> int:
        return len(engine.list(owner=who.owner))

    options: dict[str, Any] = {"template": body.template_id,
                               "network": netpolicy.compact(policy)}
    if body.timeout:
        options["timeout"] = body.timeout
    if body.env_vars:
        options["envs"] = body.env_vars
    if body.metadata:
        options["metadata"] = body.metadata
    with state.quotas.sandbox_slot(who.key, live):
        info = engine.create(**options, owner=who.owner)
    state.keys.own_volume(info.volume_id, who.owner)
    return _sandbox(info, tokens)


@router.get("/sandboxes")
def list_v1(state: State, who: Caller, metadata: str | None = None) -> list[dict[str, Any]]:
    return [_listed(i) for i in _owned(state, who, metadata, "running")]


@router.get("/v2/sandboxes")
def list_v2(response: Response, state: State, who: Caller, metadata: str | None = None,
            state_: Annotated[str | None, Query(alias="state")] = None,
            limit: Annotated[int, Query(ge=1, le=1000)] = 100,
            next_token: Annotated[str | None, Query(alias="nextToken")] = None
            ) -> list[dict[str, Any]]:
    """Paginated by sandbox id (``nextToken`` is the last id of the previous page)."""
    found = sorted(_owned(state, who, metadata, state_), key=lambda i: i.sandbox_id)
    if next_token:
        found = [i for i in found if i.sandbox_id > next_token]
    page = found[:limit]
    if len(found) > limit:
        response.headers["x-next-token"] = page[-1].sandbox_id
    return [_listed(i) for i in page]


def _owned(state: GatewayState, who: Principal, metadata: str | None,
           states: str | None) -> list[SandboxInfo]:
    wanted = _metadata_query(metadata)
    allowed = {s.strip() for s in states.split(",")} if states else {"running", "paused"}
    if not allowed <= {"running", "paused"}:
        raise InvalidArgumentError("state must be running, paused or both (comma-separated)")
    found = state.provider.list(owner=None if who.admin else who.owner)
    return [i for i in found
            if ("paused" if i.state == "paused" else "running") in allowed
            and all(i.metadata.get(k) == v for k, v in wanted.items())]


def _metadata_query(metadata: str | None) -> dict[str, str]:
    """E2B's ``metadata`` filter: ``k1=v1&k2=v2`` with each key and value quoted first (as
    E2B's SDKs send it and its API reads it)."""
    from urllib.parse import parse_qsl, unquote

    if not metadata:
        return {}
    try:
        return {unquote(k): unquote(v)
                for k, v in parse_qsl(metadata, strict_parsing=True)}
    except ValueError:
        raise InvalidArgumentError("metadata must be key=value pairs joined by &") from None


def _owned_id(state: GatewayState, who: Principal, sandbox_id: str) -> str:
    try:
        return check_sandbox(state, who, sandbox_id)
    except InvalidArgumentError:
        raise NotFoundError(f"sandbox {sandbox_id[:80]!r} not found") from None


@router.get("/sandboxes/{sandbox_id}")
def get(sandbox_id: str, state: State, tokens: Tokens, who: Caller) -> dict[str, Any]:
    info = state.provider.info(_owned_id(state, who, sandbox_id))
    return {**_listed(info), "envdAccessToken": tokens.for_sandbox(info.sandbox_id),
            "domain": None, "allowInternetAccess": info.network.mode != "off"}


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
def kill(sandbox_id: str, state: State, who: Caller) -> Response:
    state.provider.kill(_owned_id(state, who, sandbox_id), delete_volume=True)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
def set_timeout(sandbox_id: str, body: Timeout, state: State, who: Caller) -> Response:
    state.provider.set_timeout(_owned_id(state, who, sandbox_id), max(body.timeout, 1))
    return Response(status_code=204)


@router.put("/sandboxes/{sandbox_id}/network", status_code=204)
def update_network(sandbox_id: str, body: NetworkConfig, state: State,
                   who: Caller) -> Response:
    """Replaces the policy whole (E2B: omitted fields are cleared), within the ceilings."""
    policy = _policy_of(body, body.allow_internet_access)
    check_network(state, who, policy)
    state.provider.set_network(_owned_id(state, who, sandbox_id), policy)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes", status_code=204)
def refresh(sandbox_id: str, state: State, who: Caller) -> Response:
    info = state.provider.info(_owned_id(state, who, sandbox_id))
    state.provider.set_timeout(info.sandbox_id, info.timeout)  # marks it used now
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
def pause(sandbox_id: str, state: State, who: Caller) -> Response:
    sandbox_id = _owned_id(state, who, sandbox_id)
    if state.provider.info(sandbox_id).state == "paused":
        return JSONResponse({"code": 409, "message": f"sandbox {sandbox_id} is already "
                             "paused"}, status_code=409)
    state.provider.pause(sandbox_id)
    return Response(status_code=204)


def _resumed(sandbox_id: str, timeout: int, state: GatewayState,
             tokens: AccessTokens) -> tuple[dict[str, Any], bool]:
    info = state.provider.info(sandbox_id)
    was_paused = info.state == "paused"
    if was_paused:
        info = state.provider.resume(sandbox_id)
    if timeout:
        state.provider.set_timeout(sandbox_id, timeout)
    return _sandbox(info, tokens), was_paused


@router.post("/sandboxes/{sandbox_id}/resume", status_code=201)
def resume(sandbox_id: str, body: Resume, state: State, tokens: Tokens,
           who: Caller) -> Any:
    sandbox_id = _owned_id(state, who, sandbox_id)
    if state.provider.info(sandbox_id).state != "paused":
        return JSONResponse({"code": 409, "message": f"sandbox {sandbox_id} is already "
                             "running"}, status_code=409)
    return _resumed(sandbox_id, body.timeout, state, tokens)[0]


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
def connect(sandbox_id: str, body: Resume, state: State, tokens: Tokens,
            who: Caller) -> JSONResponse:
    """201 when it was paused and is resumed, 200 when it was running."""
    found, was_paused = _resumed(_owned_id(state, who, sandbox_id), body.timeout, state,
                                 tokens)
    return JSONResponse(found, status_code=201 if was_paused else 200)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def application(state: GatewayState, tokens: AccessTokens) -> FastAPI:
    """The control plane as its own app (E2B's error shape; not in our OpenAPI)."""
    # Bodies are read (whole) before the key is checked: capped, or any client could make
    # the gateway hold gigabytes.
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, max_body_size=MAX_BODY)
    app.state.gateway = state
    app.state.tokens = tokens
    app.include_router(router)

    @app.exception_handler(SandboxError)
    async def _sandbox_error(_: Request, exc: SandboxError) -> JSONResponse:
        if isinstance(exc, UnauthenticatedError):
            return _error(401, f"{exc.message.partition(':')[0]}: set E2B_API_KEY (the SDK "
                          "sends it as X-API-KEY) to a key of this gateway (`abx keys "
                          "create --e2b`)")
        reply = _error(exc.http_status, exc.message)
        if exc.http_status == 429:  # a quota: the SDK's retries would only wait longer
            reply.headers["Should-Retry"] = "false"
        return reply

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return _error(400, "the body must be JSON (Content-Type: application/json)")
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "body"
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):  # no such route: not a missing sandbox
            return _error(501, f"{request.method} {request.url.path} is not supported by "
                          "this gateway's E2B API (see docs/e2b.md for what is)")
        if exc.status_code == 413:
            return _error(413, f"the request body is over {MAX_BODY >> 20} MiB")
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in the E2B API")
        return _error(500, f"internal error: {type(exc).__name__}")

    return app
