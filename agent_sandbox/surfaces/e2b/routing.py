"""Requests E2B's SDKs address to a sandbox rather than to the API: by the headers of the
single-URL mode (``E2b-Sandbox-Id`` / ``E2b-Sandbox-Port``, ``E2B_SANDBOX_URL`` pointing at
this gateway) or by the host of the domain mode (``<port>-<sandbox id>.<domain>`` behind a
reverse proxy). Each is checked (the sandbox's access token, the sandbox exists) and handed
to what serves that port: envd (49983), the code interpreter (49999), or the sandbox's own
server through the gateway's port relay. Everything else goes on to the gateway's API.

envd's ``GET``/``POST /files`` may carry a signature instead of the token (the SDKs'
``download_url`` / ``upload_url``): checked as envd checks it. Such a URL names no sandbox
in the single-URL mode (it is ``E2B_SANDBOX_URL/files?...``): the sandbox is the one whose
token made the signature."""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

import anyio.to_thread

from agent_sandbox.core.errors import (
    InvalidArgumentError,
    NotFoundError,
    SandboxError,
    UnauthenticatedError,
)
from agent_sandbox.core.states import SandboxState
from agent_sandbox.surfaces.e2b import target
from agent_sandbox.surfaces.e2b.tokens import AccessTokens, SignedUrl
from agent_sandbox.surfaces.http.auth import Principal
from agent_sandbox.surfaces.http.errors import log
from agent_sandbox.surfaces.http.state import GatewayState
from agent_sandbox.surfaces.rest.schemas import SANDBOX_ID_PATTERN

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]
ENVD_PORT = 49983
INTERPRETER_PORT = 49999
_ID = re.compile(SANDBOX_ID_PATTERN.removeprefix("^").removesuffix("\\Z").removesuffix("$"))
_HOST = re.compile(rf"^(\d{{1,5}})-({_ID.pattern})\.")
# First path segments of E2B's API (spec/openapi.yml): answered by the control plane,
# served or refused there in E2B's shape. None is one of the gateway's own (/v1, /health...).
E2B_API_ROOTS = frozenset({"sandboxes", "v2", "v3", "templates", "snapshots", "volumes",
                           "secrets", "teams", "api-keys", "access-tokens", "nodes", "admin"})
_CONNECT_PATHS = ("/process.Process/", "/filesystem.Filesystem/")
PRINCIPAL_SCOPE_KEY = "abx.principal"  # an ASGI scope key: no client can set it


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def addressed(scope: Scope) -> tuple[str, str] | None:
    """(sandbox id, port) as the request names them, unchecked; None: not for a sandbox."""
    sandbox_id = _header(scope, b"e2b-sandbox-id")
    if sandbox_id is not None:
        return sandbox_id, _header(scope, b"e2b-sandbox-port") or str(ENVD_PORT)
    host = _header(scope, b"host") or ""
    if match := _HOST.match(host.lower()):
        return match.group(2), match.group(1)
    return None


def signed_url(scope: Scope) -> SignedUrl | None:
    """The signature of an envd ``GET``/``POST /files`` request (None: it has none)."""
    operation = {"GET": "read", "POST": "write"}.get(scope.get("method", ""))
    if scope["type"] != "http" or scope.get("path") != "/files" or operation is None:
        return None
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"),
                     keep_blank_values=True, max_num_fields=32)
    signature = (query.get("signature") or [""])[0]
    if not signature:
        return None
    expires = (query.get("signature_expiration") or [None])[0]
    if expires is not None and not re.fullmatch(r"-?[0-9]{1,18}", expires):
        expires = "-1"  # not a time: no signature can match it... and it is long past
    return SignedUrl(signature=signature[:200], path=(query.get("path") or [""])[0],
                     operation=operation, user=(query.get("username") or [""])[0],
                     expiration=None if expires is None else int(expires))


def username(scope: Scope) -> str | None:
    """The user E2B's SDK names with ``Authorization: Basic base64(user:)``."""
    scheme, _, value = (_header(scope, b"authorization") or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user = base64.b64decode(value.strip(), validate=True).decode().partition(":")[0]
    except (binascii.Error, UnicodeDecodeError):
        return None
    return user or None


class SandboxGone(NotFoundError):
    """A sandbox (its token checked) that is no longer there: 502, as E2B's proxy answers,
    which the SDKs read as "not running" (isRunning() false, Connect's unavailable)."""

    http_status = 502


class SandboxRouter:
    """ASGI middleware in front of the gateway's app (see the module's docstring)."""

    def __init__(self, app: ASGIApp, state: GatewayState, tokens: AccessTokens,
                 ports: dict[int, ASGIApp], control: ASGIApp) -> None:
        self.app, self.state, self.tokens, self.ports = app, state, tokens, ports
        self.control = control

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        where = addressed(scope) if scope["type"] in ("http", "websocket") else None
        signed = signed_url(scope) if scope["type"] == "http" else None
        if where is None and signed is not None:
            try:
                where = (await self._signer(signed), str(ENVD_PORT))
            except SandboxError as exc:
                await _refuse(scope, send, exc.http_status, exc.message)
                return
        if where is None:
            first = scope.get("path", "").split("/")[1]
            if scope["type"] == "http" and first in E2B_API_ROOTS:
                await self.control(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        try:
            found = await self._check(scope, *where, signed)
        except SandboxError as exc:
            await _refuse(scope, send, exc.http_status, exc.message)
            return
        token = target.bind(found)
        try:
            serve = self.ports.get(found.port)
            if serve is not None and scope["type"] != "http":
                await _refuse(scope, send, 400, f"port {found.port} serves HTTP, not "
                              "WebSockets")
            elif serve is None:
                await self._relay(found, scope, receive, send)
            else:
                await serve(scope, receive, send)
        except target.SandboxLost:
            log.info("e2b stream cut: sandbox %s is gone", found.sandbox_id)
        finally:
            target.unbind(token)

    async def _signer(self, url: SignedUrl) -> str:
        """The sandbox whose access token made ``url``'s signature (the single-URL mode's
        signed URLs name none): each live sandbox's is tried, a hash apiece."""
        found = await anyio.to_thread.run_sync(lambda: self.state.provider.list(owner=None))
        for info in found:
            if self.tokens.signed(info.sandbox_id, url):
                return info.sandbox_id
        raise UnauthenticatedError("invalid signature")

    async def _check(self, scope: Scope, sandbox_id: str, port_text: str,
                     signed: SignedUrl | None = None) -> target.Target:
        if not _ID.fullmatch(sandbox_id):
            raise NotFoundError(f"sandbox {sandbox_id[:80]!r} not found: E2b-Sandbox-Id "
                                "must be an id this gateway gave out (sbx-...)")
        # ASCII digits only: str.isdigit() also takes '²', which int() refuses.
        if not re.fullmatch(r"[0-9]{1,5}", port_text) or not 0 < int(port_text) < 65536:
            raise InvalidArgumentError(
                f"E2b-Sandbox-Port must be a port number, not {port_text[:20]!r}")
        given = _header(scope, b"x-access-token") or _header(scope, b"e2b-traffic-access-token")
        if not given and signed is not None and int(port_text) == ENVD_PORT:
            # As envd: the signature of the path, operation and user, then its expiration.
            if not self.tokens.signed(sandbox_id, signed):
                raise UnauthenticatedError("invalid signature")
            if signed.expired(time.time()):
                raise UnauthenticatedError("signature is already expired")
        elif not self.tokens.valid(sandbox_id, given):
            raise UnauthenticatedError(
                "this sandbox needs its access token (X-Access-Token): the envdAccessToken "
                "its create or connect answered" if not given else
                "wrong access token for this sandbox")
        try:
            info = await anyio.to_thread.run_sync(self.state.provider.info, sandbox_id)
        except NotFoundError:
            # "was not found": the words of E2B's proxy, by which the SDKs tell a sandbox
            # that is gone (SandboxNotRunningException) from one they cannot reach.
            raise SandboxGone(f"sandbox {sandbox_id} was not found: it was killed or "
                              "reached its end") from None
        if info.state != SandboxState.RUNNING:  # paused: not running, as E2B's proxy says
            raise SandboxGone(f"sandbox {sandbox_id} is {info.state}, not running: "
                              "Sandbox.connect() resumes it")
        return target.Target(self.state, sandbox_id, info.owner, int(port_text),
                             username(scope))

    async def _relay(self, found: target.Target, scope: Scope, receive: Any,
                     send: Any) -> None:
        """Another port: the gateway's own port relay, as the sandbox's owner."""
        key = None
        if found.owner:
            key = await anyio.to_thread.run_sync(self.state.keys.get, found.owner)
        headers = [(k, v) for k, v in scope.get("headers", ())
                   if k.lower() not in (b"x-access-token", b"e2b-traffic-access-token",
                                        b"e2b-sandbox-id", b"e2b-sandbox-port")]
        path = f"/v1/sandboxes/{found.sandbox_id}/ports/{found.port}{scope['path']}"
        inner = {**scope, "path": path, "raw_path": path.encode(), "headers": headers,
                 PRINCIPAL_SCOPE_KEY: Principal(key)}
        await self.app(inner, receive, send)


_CONNECT_CODES = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied",
                  404: "not_found", 409: "failed_precondition", 429: "resource_exhausted",
                  502: "unavailable", 503: "unavailable", 504: "deadline_exceeded"}


async def _refuse(scope: Scope, send: Any, status: int, message: str) -> None:
    """An error before any service ran: Connect's error body on its paths, E2B's
    ``{code, message}`` elsewhere; a WebSocket is closed with it."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 4000 + status % 1000,
                    "reason": message[:120]})
        return
    if scope["path"].startswith(_CONNECT_PATHS):
        body: dict[str, Any] = {"code": _CONNECT_CODES.get(status, "unknown"),
                                "message": message}
    else:
        body = {"code": status, "message": message}
    data = json.dumps(body).encode()
    log.info("e2b sandbox request refused: %s %s", status, message)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
