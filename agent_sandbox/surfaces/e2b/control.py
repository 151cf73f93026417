"""E2B's control plane (``E2B_API_URL`` pointed at this gateway): create, get, list, kill,
timeout, pause, resume and connect, on the gateway's provider with the gateway's tenancy
and quotas. Keys are the gateway's (``X-API-KEY``). The shapes are E2B's OpenAPI
(spec/openapi.yml of e2b-dev/E2B); errors are its ``{code, message}``."""

from __future__ import annotations

import datetime
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent_sandbox.core import network as netpolicy
from agent_sandbox.core.bounds import MAX_SANDBOX_TIMEOUT
from agent_sandbox.core.errors import (
    InvalidArgumentError,
    NotFoundError,
    SandboxError,
    UnauthenticatedError,
)
from agent_sandbox.core.metrics import SandboxMetrics
from agent_sandbox.core.models import SandboxInfo, SandboxLogEntry, SnapshotInfo
from agent_sandbox.core.secrets import MAX_SECRETS, SecretInfo
from agent_sandbox.core.secrets import check_name as check_secret_name
from agent_sandbox.core.spec import CreateSpec
from agent_sandbox.core.states import SandboxState
from agent_sandbox.core.validate import SNAPSHOT_NAME_PATTERN
from agent_sandbox.surfaces.e2b import envd, tags, templates
from agent_sandbox.surfaces.e2b.catalog import tags_for
from agent_sandbox.surfaces.e2b.tokens import AccessTokens
from agent_sandbox.surfaces.http.auth import Principal, check_network, check_sandbox, principal
from agent_sandbox.surfaces.http.errors import log
from agent_sandbox.surfaces.http.state import GatewayState

ENVD_VERSION = envd.VERSION
MAX_TIMEOUT = min(24 * 3600, MAX_SANDBOX_TIMEOUT)  # E2B's own bound, and ours
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
    rules: dict[str, Any] | None = None  # per-host header transforms: secrets_of

    def refuse_unsupported(self) -> None:
        """E2B's egress proxy, DNS servers and host masks have no counterpart here:
        refused by name rather than silently dropped."""
        extra = sorted(k for k, v in (self.model_extra or {}).items() if v not in (None, {}, []))
        if extra:
            raise InvalidArgumentError(
                f"network option(s) {', '.join(extra)} are not supported by this gateway: "
                "use allowOut / denyOut (names, *.wildcards, CIDRs), allow_internet_access "
                "or rules with ${e2b.secrets.NAME} headers (see docs/e2b.md)")


_SECRET_REF = re.compile(r"\$\{e2b\.secrets\.([^{}]*)\}")
_LITERAL_HEADER = ("a header value that names no stored secret is not taken (it would be a "
                   "credential in the create request): store it (abx secrets create NAME "
                   "--host HOST --header H --format 'Bearer {}' --inject) and give "
                   "'Bearer ${e2b.secrets.NAME}' (Secret.fill('NAME'))")


def secrets_of(net: NetworkConfig | None, stored: list[SecretInfo]) -> list[str]:
    """E2B's ``network.rules`` (``{host: [{"transform": {"headers": {H: V}}}]}``) as the
    names of the caller's stored secrets to give the sandbox. Each header value must be
    one ``${e2b.secrets.NAME}`` in a format (``Bearer ${e2b.secrets.gh}``) that is that
    secret's own stored rule for that host, made with inject (the proxy sets the header
    on every request to it); anything else is refused, naming what."""
    if net is None or not net.rules:
        return []
    if not isinstance(net.rules, dict) or len(net.rules) > MAX_SECRETS:
        raise InvalidArgumentError(f"network.rules: at most {MAX_SECRETS} hosts, each a "
                                   "list of rules")
    mine = {s.name: s for s in stored}
    names: list[str] = []
    for host, rules in net.rules.items():
        if not isinstance(rules, list):
            raise InvalidArgumentError(f"network.rules[{host[:80]!r}] must be a list of rules")
        for i, rule in enumerate(rules):
            where = f"network.rules[{host[:80]!r}][{i}]"
            transform = rule.get("transform") if isinstance(rule, dict) else None
            unknown = sorted(set(rule) - {"transform"}) if isinstance(rule, dict) else ["?"]
            if unknown or not isinstance(transform, dict) or set(transform) - {"headers"} \
                    or not isinstance(transform.get("headers"), dict):
                raise InvalidArgumentError(
                    f"{where}: only {{\"transform\": {{\"headers\": {{...}}}}}} is supported "
                    f"by this gateway, not {', '.join(unknown or sorted(set(transform or {})))}")
            for header, value in transform["headers"].items():
                if not isinstance(value, str) or len(value) > 1000:
                    raise InvalidArgumentError(f"{where}: header {header[:64]!r} must be text")
                if "${e2b.identity." in value:
                    raise InvalidArgumentError(
                        f"{where}: workload identity tokens (iam) are not supported by this "
                        "gateway; store a secret and give ${e2b.secrets.NAME}")
                refs = _SECRET_REF.findall(value)
                fmt = _SECRET_REF.sub("{}", value)
                if len(refs) != 1 or "${" in fmt or "{" in fmt.replace("{}", ""):
                    raise InvalidArgumentError(
                        f"{where}: header {header[:64]!r}: " + (
                            "give one ${e2b.secrets.NAME} per header" if refs
                            else _LITERAL_HEADER))
                name = check_secret_name(refs[0])
                if name not in mine:
                    raise NotFoundError(f"{where}: no secret named {name} (create it with "
                                        "abx secrets create or POST /v1/secrets)")
                why = mine[name].header_transform_refused(host, header, fmt)
                if why:
                    raise InvalidArgumentError(f"{where}: {why}")
                names.append(name)
    return list(dict.fromkeys(names))


class NewSandbox(_Body):
    template_id: str = Field(alias="templateID", min_length=1, max_length=200)
    timeout: int = Field(15, ge=0, le=MAX_TIMEOUT)
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(None, alias="envVars")
    allow_internet_access: bool | None = None
    network: NetworkConfig | None = None
    iam: dict[str, Any] | None = None  # workload identity: refused (refuse_unsupported)
    mcp: dict[str, Any] | None = None  # an MCP gateway in the sandbox: refused
    volume_mounts: list[Any] | None = Field(None, alias="volumeMounts")  # refused

    def refuse_unsupported(self) -> None:
        """What a create asks for that this gateway cannot honour: refused by name."""
        asked = [name for name, value in (("iam", self.iam), ("mcp", self.mcp),
                                          ("volumeMounts", self.volume_mounts))
                 if value not in (None, {}, [])]
        if "iam" in asked and not any(self.iam.values()):  # type: ignore[union-attr]
            asked.remove("iam")  # {"tokens": {}}: none asked for
        if asked:
            raise InvalidArgumentError(
                f"create option(s) {', '.join(asked)} are not supported by this gateway "
                "(see docs/e2b.md)")


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
            "state": "paused" if info.state == SandboxState.PAUSED else "running",
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
def create(body: NewSandbox, state: State, tokens: Tokens, who: Caller, request: Request
           ) -> dict[str, Any]:
    body.refuse_unsupported()
    if ":" in body.template_id:  # E2B's name:tag
        body.template_id = request.app.state.template_tags.resolve(state, who, body.template_id)
    policy = _policy(body)
    check_network(state, who, policy)
    secrets = secrets_of(body.network, state.provider.list_secrets(owner=who.owner)) \
        if body.network is not None and body.network.rules else []
    engine = state.provider

    def live() -> int:
        return len(engine.list(owner=who.owner))

    # E2B's fields as our create options: checked once, with the messages every surface
    # gives (an unset or zero timeout is the default).
    snapshot = snapshot_of(state, who, body.template_id)  # a snapshot is a template in E2B
    spec = CreateSpec.of(template=None if snapshot else body.template_id, network=policy,
                         timeout=body.timeout or None, envs=body.env_vars,
                         metadata=body.metadata, snapshot=snapshot, secrets=secrets)
    with state.quotas.sandbox_slot(who.key, live):
        info = engine.create(**spec.options(), owner=who.owner)
    state.keys.own_volume(info.volume_id, who.owner)
    return _sandbox(info, tokens)


@router.get("/sandboxes")
def list_v1(state: State, who: Caller, metadata: str | None = None) -> list[dict[str, Any]]:
    return [_listed(i) for i in _ordered(_owned(state, who, metadata, "running"), "desc")]


@router.get("/v2/sandboxes")
def list_v2(response: Response, state: State, who: Caller, metadata: str | None = None,
            state_: Annotated[str | None, Query(alias="state")] = None,
            limit: Annotated[int, Query(ge=1, le=1000)] = 100,
            next_token: Annotated[str | None, Query(alias="nextToken", max_length=200)] = None,
            template: Annotated[str | None, Query(max_length=200)] = None,
            started_after: Annotated[datetime.datetime | None,
                                     Query(alias="startedAfter")] = None,
            order: Annotated[Literal["asc", "desc"], Query()] = "desc",
            ) -> list[dict[str, Any]]:
    """E2B's listing: filtered by metadata, state, template and start time, ordered by start
    time (newest first unless ``order=asc``), paged by ``nextToken``: the position (start
    time, id) of the last sandbox of the previous page, so a page neither repeats nor skips
    one whichever order is asked, even when sandboxes come and go between pages."""
    found = _owned(state, who, metadata, state_)
    if template:
        found = [i for i in found if i.template == template]
    if started_after is not None:
        if started_after.tzinfo is None:  # E2B reads a naive time as UTC
            started_after = started_after.replace(tzinfo=datetime.UTC)
        # As the listing shows it (to the microsecond), so its own startedAt matches.
        found = [i for i in found
                 if datetime.datetime.fromtimestamp(i.created_at, datetime.UTC) >= started_after]
    found = _ordered(found, order)
    if next_token:
        after = _position(next_token)
        found = [i for i in found
                 if ((i.created_at, i.sandbox_id) > after if order == "asc"
                     else (i.created_at, i.sandbox_id) < after)]
    page = found[:limit]
    if len(found) > limit:
        response.headers["x-next-token"] = f"{page[-1].created_at!r}/{page[-1].sandbox_id}"
    return [_listed(i) for i in page]


def _ordered(found: list[SandboxInfo], order: str) -> list[SandboxInfo]:
    return sorted(found, key=lambda i: (i.created_at, i.sandbox_id), reverse=order == "desc")


def _position(token: str) -> tuple[float, str]:
    """A ``nextToken`` this gateway gave out: ``<start time>/<sandbox id>``."""
    at, _, sandbox_id = token.partition("/")
    try:
        return float(at), sandbox_id
    except ValueError:
        raise InvalidArgumentError("nextToken must be the x-next-token header of the previous "
                                   "page, unchanged") from None


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


def _metric(m: SandboxMetrics) -> dict[str, Any]:
    """E2B's ``SandboxMetric``."""
    return {"timestamp": _time(m.timestamp), "timestampUnix": int(m.timestamp),
            "cpuCount": m.cpu_count, "cpuUsedPct": m.cpu_used_pct, "memUsed": m.mem_used,
            "memTotal": m.mem_total, "memCache": m.mem_cache, "diskUsed": m.disk_used,
            "diskTotal": m.disk_total}


@router.get("/sandboxes/metrics")
def metrics_of_many(state: State, who: Caller,
                    sandbox_ids: Annotated[str, Query(max_length=100 * 40)]
                    ) -> dict[str, Any]:
    """The latest sample of each of (at most 100) sandboxes; ids not the caller's are left
    out, as E2B leaves out ids it does not know."""
    wanted = [i for i in dict.fromkeys(x.strip() for x in sandbox_ids.split(",")) if i]
    if len(wanted) > 100:
        raise InvalidArgumentError("sandbox_ids names at most 100 sandboxes")
    found: dict[str, Any] = {}
    for sandbox_id in wanted:
        try:
            samples = state.provider.metrics(_owned_id(state, who, sandbox_id))
        except NotFoundError:
            continue
        if samples:
            found[sandbox_id] = _metric(samples[-1])
    return {"sandboxes": found}


@router.get("/sandboxes/{sandbox_id}")
def get(sandbox_id: str, state: State, tokens: Tokens, who: Caller) -> dict[str, Any]:
    info = state.provider.info(_owned_id(state, who, sandbox_id))
    return {**_listed(info), "envdAccessToken": tokens.for_sandbox(info.sandbox_id),
            "domain": None, "allowInternetAccess": info.network.mode != "off"}


@router.get("/sandboxes/{sandbox_id}/metrics")
def metrics(sandbox_id: str, state: State, who: Caller,
            start: Annotated[int | None, Query(ge=0)] = None,
            end: Annotated[int | None, Query(ge=0)] = None) -> list[dict[str, Any]]:
    """Its samples between ``start`` and ``end`` (Unix seconds), oldest first."""
    found = state.provider.metrics(_owned_id(state, who, sandbox_id), start, end)
    return [_metric(m) for m in found]


_LEVELS = ("debug", "info", "warn", "error")


def _log_entry(e: SandboxLogEntry) -> dict[str, Any]:
    """E2B's ``SandboxLogEntry``."""
    return {"timestamp": _time(e.timestamp), "message": e.message, "level": e.level,
            "fields": {"source": e.source}}


@router.get("/sandboxes/{sandbox_id}/logs")
def logs_v1(sandbox_id: str, state: State, who: Caller,
            start: Annotated[int | None, Query(ge=0)] = None,
            limit: Annotated[int, Query(ge=0, le=1000)] = 1000) -> dict[str, Any]:
    """Its log from ``start`` (Unix milliseconds), oldest first (``sandbox_logs``)."""
    found = [e for e in state.provider.logs(_owned_id(state, who, sandbox_id))
             if start is None or e.timestamp * 1000 >= start][:limit]
    return {"logs": [{"timestamp": _time(e.timestamp), "line": e.message} for e in found],
            "logEntries": [_log_entry(e) for e in found]}


@router.get("/v2/sandboxes/{sandbox_id}/logs")
def logs_v2(sandbox_id: str, state: State, who: Caller,
            cursor: Annotated[int | None, Query(ge=0)] = None,
            limit: Annotated[int, Query(ge=0, le=1000)] = 1000,
            direction: Annotated[Literal["forward", "backward"], Query()] = "forward",
            level: Annotated[Literal["debug", "info", "warn", "error"] | None, Query()] = None,
            search: Annotated[str | None, Query(max_length=256)] = None
            ) -> dict[str, Any]:
    """E2B's v2: from ``cursor`` (Unix milliseconds) on, oldest first, or back from it,
    newest first; at ``level`` or above; whose message holds ``search``."""
    found = state.provider.logs(_owned_id(state, who, sandbox_id))
    if cursor is not None:
        found = [e for e in found if (e.timestamp * 1000 >= cursor if direction == "forward"
                                      else e.timestamp * 1000 <= cursor)]
    if level is not None:
        found = [e for e in found if _LEVELS.index(e.level) >= _LEVELS.index(level)]
    if search:
        found = [e for e in found if search in e.message]
    if direction == "backward":
        found.reverse()
    return {"logs": [_log_entry(e) for e in found[:limit]]}


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
    """Replaces the policy whole (E2B: omitted fields are cleared), within the ceilings.
    A sandbox's secrets are given at its create: rules here are refused."""
    if body.rules:
        raise InvalidArgumentError("network.rules (header transforms) are set when a sandbox "
                                   "is created; update_network cannot change them")
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


def _resumed(sandbox_id: str, timeout: int, state: GatewayState, tokens: AccessTokens,
             *, extend_only: bool = False) -> tuple[dict[str, Any], bool]:
    """Resumed if paused, its timeout set to ``timeout`` (``extend_only``: only when that
    ends it later than it would end now, as E2B's connect: it never shortens one)."""
    info = state.provider.info(sandbox_id)
    was_paused = info.state == "paused"
    if was_paused:
        info = state.provider.resume(sandbox_id)
    if timeout and not (extend_only and time.time() + timeout <= info.expires_at):
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
                                 tokens, extend_only=True)
    return JSONResponse(found, status_code=201 if was_paused else 200)


# ---- snapshots and fork (E2B's SDK: create_snapshot, list_snapshots, delete_snapshot,
# fork, and create(template=<snapshot>)) ----------------------------------------------------
MAX_FORKS = 20  # E2B's own bound on a fork's count


class NewSnapshot(_Body):
    name: str | None = Field(None, pattern=SNAPSHOT_NAME_PATTERN)


class Fork(_Body):
    timeout: int = Field(0, ge=0, le=MAX_TIMEOUT)
    count: int = Field(1, ge=1, le=MAX_FORKS)


def _snapshot_info(snap: SnapshotInfo) -> dict[str, Any]:
    return {"snapshotID": snap.snapshot_id,
            "names": [snap.name] if snap.name else [snap.snapshot_id]}


def _named(snap: SnapshotInfo, name: str) -> bool:
    """``name`` names the snapshot: its id, or the name it was given."""
    return name in (snap.snapshot_id, snap.name)


def snapshot_of(state: GatewayState, who: Principal, template: str) -> str | None:
    """The caller's snapshot a create's templateID names, else None: a template."""
    owner = None if who.admin else who.owner
    for snap in state.provider.list_snapshots(owner=owner):
        if _named(snap, template):
            return snap.snapshot_id
    return None


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
def create_snapshot(sandbox_id: str, state: State, who: Caller,
                    body: NewSnapshot | None = None) -> dict[str, Any]:
    """Its processes, memory and files; it runs on. ``templateID`` of a create starts
    copies of it."""
    sandbox_id = _owned_id(state, who, sandbox_id)
    name = body.name if body else None
    return _snapshot_info(state.provider.snapshot(sandbox_id, name, owner=who.owner))


@router.get("/snapshots")
def list_snapshots(state: State, who: Caller,
                   sandbox_id: Annotated[str | None, Query(alias="sandboxID")] = None,
                   name: Annotated[str | None, Query(max_length=300)] = None,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 1000) -> list[dict[str, Any]]:
    """The caller's snapshots, of one sandbox (``sandboxID``) or named ``name`` (its id
    or its name) if given."""
    snaps = state.provider.list_snapshots(owner=None if who.admin else who.owner)
    return [_snapshot_info(s) for s in snaps
            if (sandbox_id is None or s.sandbox_id == sandbox_id)
            and (name is None or _named(s, name))][:limit]


@router.delete("/templates/{template_id}", status_code=204)
def delete_snapshot_or_template(template_id: str, state: State, who: Caller) -> Response:
    """E2B's snapshots are templates: the id of one of the caller's snapshots deletes
    it; any other id is a template (its builder's to delete: templates.py)."""
    found = snapshot_of(state, who, template_id)
    if found is None:
        return templates.delete_template(template_id, state, who)
    state.provider.delete_snapshot(found)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201)
def fork(sandbox_id: str, body: Fork, state: State, tokens: Tokens,
         who: Caller) -> list[dict[str, Any]]:
    """A snapshot of the sandbox (which runs on), ``count`` sandboxes started from it at
    once; each fork's result is its sandbox or its error. The snapshot is dropped once
    they run."""
    sandbox_id = _owned_id(state, who, sandbox_id)
    engine = state.provider
    snap = engine.snapshot(sandbox_id, owner=who.owner)

    def one(_: int) -> dict[str, Any]:
        try:
            with state.quotas.sandbox_slot(who.key, lambda: len(engine.list(owner=who.owner))):
                info = engine.create(snapshot=snap.snapshot_id, timeout=body.timeout or None,
                                     owner=who.owner)
            state.keys.own_volume(info.volume_id, who.owner)
            return {"sandbox": _sandbox(info, tokens)}
        except SandboxError as exc:
            return {"error": {"code": exc.http_status, "message": exc.message}}

    try:
        with ThreadPoolExecutor(min(body.count, 8)) as pool:
            return list(pool.map(one, range(body.count)))
    finally:
        engine.delete_snapshot(snap.snapshot_id)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def application(state: GatewayState, tokens: AccessTokens) -> FastAPI:
    """The control plane as its own app (E2B's error shape; not in our OpenAPI)."""
    # Bodies are read (whole) before the key is checked: capped, or any client could make
    # the gateway hold gigabytes.
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, max_body_size=MAX_BODY)
    app.state.gateway = state
    app.state.tokens = tokens
    app.state.template_tags = tags_for(state)
    app.include_router(tags.router)  # before /templates/{id}: tags is no template's id
    app.include_router(router)
    app.include_router(templates.router)  # E2B's template API (surfaces/e2b/templates.py)

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
