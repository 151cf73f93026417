"""Port previews a browser can open: share links (docs/ports.md).

API (an API key; the sandbox's owner): ``POST /v1/sandboxes/{id}/shares`` makes a link
to one port with a revocable, expiring token; ``GET`` lists them (without tokens);
``DELETE .../shares/{share_id}`` revokes one.

Browser: ``/share/{token}`` checks the token, sets it as an HttpOnly cookie scoped to the
link's path and redirects to ``/s/{share_id}/``, whose every request (page, assets, form
POSTs, WebSockets) is relayed to the port while the cookie is the link's. With
``ABX_GATEWAY_PREVIEW_URL`` (a wildcard domain) a link is
``https://PORT-SANDBOX.DOMAIN/__abx/share/{token}`` instead, each port its own browser
origin (``PreviewHosts``, in front of the E2B routing of the same host names).

The token never reaches the sandbox: the gateway's cookie is taken out of what is
relayed, the token's URL is answered here with a redirect (no Referer carries it). Each
request checks the link (revoked, expired) and that its sandbox still exists; what stays
open through a link is cut when it ends (``LiveRelays``): a WebSocket is closed (1008) at
once on revoke, and at its expiry or its sandbox's end within WATCH_EVERY seconds; a
response being streamed stops at its next chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    MutableMapping,
)
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import urlsplit

import anyio.to_thread
from fastapi import APIRouter, Depends, Request, Response, WebSocket
from fastapi.responses import PlainTextResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field

from agent_sandbox.core.errors import NotFoundError, PermissionDeniedError
from agent_sandbox.core.shares import MAX_SECONDS, PortShare
from agent_sandbox.core.validate import port as check_port
from agent_sandbox.surfaces.http.shares import ShareStore
from agent_sandbox.surfaces.http.state import GatewayState
from agent_sandbox.surfaces.rest.routes.deps import Caller, SandboxId, State
from agent_sandbox.surfaces.rest.routes.ports import exposed, forward, relay_websocket

router = APIRouter(prefix="/v1/sandboxes/{sandbox_id}/shares", tags=["ports"])
browser = APIRouter(include_in_schema=False)
COOKIE = "abx_share"
MAX_TOKENS = 8  # abx_share cookies of one request tried as the link's
HOST_SHARE_PATH = "/__abx/share/"
HOST_SCOPE_KEY = "abx.preview_host"  # an ASGI scope key: no client can set it
_NOT_FOUND = "This preview link is not valid: it was revoked, it expired, or its sandbox " \
             "is gone. Ask for a new one.\n"
_NO_COOKIE = "This preview needs its link: open the share link you were given (it signs " \
             "this browser in for this port).\n"
_OTHER_SANDBOX = "A page of another sandbox's preview may not use this preview's link.\n"


_TOKEN_PATH = re.compile(r"(/share/|/__abx/share/)[A-Za-z0-9_-]+")


class RedactShareTokens(logging.Filter):
    """A share link's token is a credential: an access log line names its path without it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_TOKEN_PATH.sub(r"\1<token>", a) if isinstance(a, str) else a
                                for a in record.args)
        return True


logging.getLogger("uvicorn.access").addFilter(RedactShareTokens())


WATCH_EVERY = 5.0  # seconds between an open WebSocket's checks of its link


class LiveRelays:
    """What is open through each link (WebSockets, streamed responses), each with an
    event set when the link is revoked here. Used only on the gateway's event loop."""

    def __init__(self) -> None:
        self._open: dict[str, set[asyncio.Event]] = {}

    @contextlib.contextmanager
    def watch(self, share_id: str) -> Iterator[asyncio.Event]:
        cut = asyncio.Event()
        self._open.setdefault(share_id, set()).add(cut)
        try:
            yield cut
        finally:
            found = self._open.get(share_id, set())
            found.discard(cut)
            if not found:
                self._open.pop(share_id, None)

    def cut(self, share_id: str) -> None:
        for event in self._open.get(share_id, ()):
            event.set()


@dataclass
class Previews:
    store: ShareStore
    public_ports: bool = False
    preview_url: str = ""  # scheme://domain[:port] of host-routed previews, or ""
    live: LiveRelays = field(default_factory=LiveRelays)

    @property
    def host_pattern(self) -> re.Pattern[str] | None:
        if not self.preview_url:
            return None
        netloc = urlsplit(self.preview_url).netloc.lower()
        return re.compile(rf"^(\d{{1,5}})-(sbx-[a-z0-9]{{10}})\.{re.escape(netloc)}$")

    def from_other_sandbox(self, origin: str | None, sandbox_id: str) -> bool:
        """Whether ``origin`` (a request's Origin header) is a page of another sandbox's
        host-routed preview: of the same site as every preview (and maybe the gateway),
        so the browser sends a link's SameSite=Lax cookie along with what such a page
        makes it ask (a fetch, a form POST, a WebSocket, which no CORS guards)."""
        pattern = self.host_pattern
        if pattern is None or not origin:
            return False
        seen = pattern.match(urlsplit(origin.strip().lower()).netloc)
        return seen is not None and seen.group(2) != sandbox_id

    def link(self, base: str, share: PortShare, token: str | None) -> str:
        if self.preview_url:
            parts = urlsplit(self.preview_url)
            origin = f"{parts.scheme}://{share.port}-{share.sandbox_id}.{parts.netloc}"
            return origin + (f"{HOST_SHARE_PATH}{token}" if token else "/")
        return base.rstrip("/") + (f"/share/{token}" if token else f"/s/{share.share_id}/")


def previews(request: Request) -> Previews:
    return request.app.state.previews


PreviewState = Annotated[Previews, Depends(previews)]


class ShareBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    port: int = Field(ge=1, le=65535, description="the port inside the sandbox")
    public: bool = Field(False, description="no token: anyone with the URL (only where the "
                                            "operator allows public ports)")
    expires_in: float | None = Field(None, gt=0, le=MAX_SECONDS,
                                     description="seconds it works (default a day)")


@router.post("", status_code=201)
def create_share(sandbox_id: SandboxId, body: ShareBody, request: Request, who: Caller,
                 shown: PreviewState) -> PortShare:
    """A link a browser can open to ``port`` inside the sandbox, with no API key; its
    ``url`` holds the token (shown this once)."""
    check_port(body.port)
    if body.public and not shown.public_ports:
        raise PermissionDeniedError(
            "a public port link (no token) is more than this gateway's operator allows: "
            "ABX_GATEWAY_PUBLIC_PORTS=true allows them; a link with a token (public=false) "
            "needs no setting")
    share, token = shown.store.create(sandbox_id, body.port, who.owner, public=body.public,
                                      expires_in=body.expires_in)
    return share.model_copy(update={"url": shown.link(str(request.base_url), share, token)})


@router.get("")
def list_shares(sandbox_id: SandboxId, request: Request, shown: PreviewState
                ) -> list[PortShare]:
    """The sandbox's live links (their tokens are not shown again)."""
    base = str(request.base_url)
    return [s.model_copy(update={"url": shown.link(base, s, None) if s.public else ""})
            for s in shown.store.list(sandbox_id)]


@router.delete("/{share_id}", status_code=204)
async def revoke_share(sandbox_id: SandboxId, share_id: str, shown: PreviewState
                       ) -> Response:
    """The link stops working at once: its next request is refused, and what is open
    through it (a WebSocket, a streamed response) is cut."""
    await anyio.to_thread.run_sync(shown.store.revoke, sandbox_id, share_id)
    shown.live.cut(share_id)
    return Response(status_code=204)


# the browser's side ------------------------------------------------------------------------
def _refused(status: int, text: str) -> PlainTextResponse:
    return PlainTextResponse(text, status_code=status, headers={
        "Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})


def _set_cookie(response: Response, share: PortShare, token: str, path: str,
                secure: bool) -> None:
    response.set_cookie(COOKIE, token, max_age=max(1, int(share.expires_at - time.time())),
                        path=path, httponly=True, samesite="lax", secure=secure)
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"


def app_cookies(header: str | None) -> str | None:
    """The Cookie header without the gateway's own cookie (the app's cookies go on)."""
    if not header:
        return None
    kept = [part.strip() for part in header.split(";")
            if part.strip() and part.split("=", 1)[0].strip() != COOKIE]
    return "; ".join(kept) or None


def _cookie_allowed(set_cookie: str, prefix: str | None) -> bool:
    """An app's Set-Cookie that stays its own: not the gateway's cookie, no Domain (it
    would reach other previews' hosts), and under a path link, no Path outside the link
    (the gateway's other pages are on the same origin)."""
    name, _, rest = set_cookie.partition("=")
    if name.strip() == COOKIE:
        return False
    attributes = [a.strip().lower() for a in rest.split(";")[1:]]
    if any(a.startswith("domain") for a in attributes):
        return False
    paths = [a.partition("=")[2].strip() for a in attributes if a.startswith("path")]
    return prefix is None or all(p == prefix or p.startswith(prefix + "/") for p in paths)


def _tokens(header: str | None) -> list[str]:
    """Every ``abx_share`` value of a Cookie header (at most MAX_TOKENS): a page on the
    same origin or domain can plant one of that name beside the link's own (script
    cannot overwrite an HttpOnly cookie, but can shadow it), so no single one is taken
    for the link's."""
    out = []
    for part in (header or "").split(";"):
        name, eq, value = part.strip().partition("=")
        if eq and name.strip() == COOKIE and (value := value.strip().strip('"')):
            out.append(value)
    return list(dict.fromkeys(out))[:MAX_TOKENS]


async def _alive(state: GatewayState, shown: Previews, share: PortShare) -> bool:
    """Its sandbox still exists (a link dies with its sandbox)."""
    try:
        await anyio.to_thread.run_sync(state.provider.info, share.sandbox_id)
        return True
    except NotFoundError:
        await anyio.to_thread.run_sync(shown.store.forget_sandbox, share.sandbox_id)
        return False


@browser.get("/share/{token}")
async def open_share(token: str, request: Request, state: State,
                     shown: PreviewState) -> Response:
    share = await anyio.to_thread.run_sync(shown.store.by_token, token)
    if share is None or not await _alive(state, shown, share):
        return _refused(404, _NOT_FOUND)
    home = f"/s/{share.share_id}/"
    response = RedirectResponse(home, status_code=303)
    _set_cookie(response, share, token, home, request.url.scheme == "https")
    return response


async def _admitted(state: GatewayState, shown: Previews, share_id: str,
                    cookie_header: str | None, origin: str | None) -> PortShare | Response:
    share = None
    for token in _tokens(cookie_header) or [None]:
        if share := await anyio.to_thread.run_sync(shown.store.admit, share_id, token):
            break
    if share is None:  # a live link without its cookie, or no such link
        try:
            await anyio.to_thread.run_sync(shown.store.get, share_id)
        except NotFoundError:
            return _refused(404, _NOT_FOUND)
        return _refused(401, _NO_COOKIE)
    if not await _alive(state, shown, share):
        return _refused(404, _NOT_FOUND)
    if shown.from_other_sandbox(origin, share.sandbox_id):
        return _refused(403, _OTHER_SANDBOX)
    return share


@browser.api_route("/s/{share_id}", methods=["GET", "HEAD"])
async def share_home(share_id: str) -> Response:
    return RedirectResponse(f"/s/{share_id}/", status_code=307)


@browser.api_route("/s/{share_id}/{path:path}",
                   methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
async def share_http(share_id: str, path: str, request: Request, state: State,
                     shown: PreviewState) -> Response:
    found = await _admitted(state, shown, share_id, request.headers.get("cookie"),
                            request.headers.get("origin"))
    if isinstance(found, Response):
        return found
    by_host = request.scope.get(HOST_SCOPE_KEY, False)
    response = await forward(state, found.sandbox_id, found.port, path, request,
                             prefix=None if by_host else f"/s/{share_id}",
                             cookie=app_cookies(request.headers.get("cookie")))
    response.body_iterator = _while_linked(response.body_iterator, shown, found)
    cookies = [v for k, v in response.headers.items() if k == "set-cookie"]
    kept = [v for v in cookies if _cookie_allowed(v, None if by_host else f"/s/{share_id}")]
    if len(kept) != len(cookies):
        del response.headers["set-cookie"]
        for value in kept:
            response.headers.append("set-cookie", value)
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


@browser.websocket("/s/{share_id}/{path:path}")
async def share_websocket(websocket: WebSocket, share_id: str, path: str) -> None:
    state: GatewayState = websocket.app.state.gateway
    shown: Previews = websocket.app.state.previews
    found = await _admitted(state, shown, share_id, websocket.headers.get("cookie"),
                            websocket.headers.get("origin"))
    if isinstance(found, Response):
        await websocket.close(code=4000 + found.status_code, reason="share link refused")
        return
    base = await exposed(state, found.sandbox_id, found.port)
    cookies = app_cookies(websocket.headers.get("cookie"))
    share = found
    with shown.live.watch(share.share_id) as cut:
        await relay_websocket(websocket, base, share.port, path,
                              [("cookie", cookies)] if cookies else None,
                              until=lambda: _link_ends(state, shown, share, cut))


async def _link_ends(state: GatewayState, shown: Previews, share: PortShare,
                     cut: asyncio.Event) -> str:
    """Returns (why) when the link is revoked here (at once), or, checked every
    WATCH_EVERY seconds and at its expiry, is gone (revoked elsewhere, expired) or its
    sandbox is."""
    while True:
        wait = min(WATCH_EVERY, max(0.05, share.expires_at - time.time()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cut.wait(), wait)
        if cut.is_set():
            return "share link revoked"
        try:
            await anyio.to_thread.run_sync(shown.store.get, share.share_id)
        except NotFoundError:
            return "share link revoked or expired"
        if not await _alive(state, shown, share):
            return "the sandbox is gone"


async def _while_linked(body: AsyncIterable[Any], shown: Previews, share: PortShare
                        ) -> AsyncIterator[Any]:
    """A streamed response that stops at its next chunk once its link is revoked here or
    has expired."""
    with shown.live.watch(share.share_id) as cut:
        async for chunk in body:
            if cut.is_set() or time.time() >= share.expires_at:
                return
            yield chunk


# host-routed previews -------------------------------------------------------------------
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]
_E2B_TOKENS = (b"x-access-token", b"e2b-traffic-access-token", b"e2b-sandbox-id")


class PreviewHosts:
    """ASGI middleware: ``PORT-SANDBOX.DOMAIN`` requests of a browser (no E2B access
    token) go to the share link of that sandbox and port: ``/__abx/share/TOKEN`` sets the
    cookie (this host only), then every path is relayed while it holds."""

    def __init__(self, app: ASGIApp, shown: Previews, state: GatewayState) -> None:
        self.app, self.shown, self.state = app, shown, state
        self.pattern = shown.host_pattern

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if self.pattern is None or scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        host = headers.get(b"host", b"").decode("latin-1").lower()
        match = self.pattern.match(host)
        if match is None or any(h in headers for h in _E2B_TOKENS):
            return await self.app(scope, receive, send)
        port, sandbox_id = int(match.group(1)), match.group(2)
        if self.shown.from_other_sandbox(headers.get(b"origin", b"").decode("latin-1"),
                                         sandbox_id):
            return await self._refuse(scope, receive, send, _OTHER_SANDBOX, 403)
        path: str = scope.get("path", "/")
        tokens = [path[len(HOST_SHARE_PATH):]] if path.startswith(HOST_SHARE_PATH) else \
            _tokens(headers.get(b"cookie", b"").decode("latin-1"))
        store = self.shown.store
        share = token = None
        for token in tokens:
            share = await anyio.to_thread.run_sync(store.by_token, token) if token else None
            if share is not None and (share.sandbox_id, share.port) == (sandbox_id, port):
                break
        if share is None or (share.sandbox_id, share.port) != (sandbox_id, port):
            share = await anyio.to_thread.run_sync(store.public_for, sandbox_id, port)
        if share is None or (share.sandbox_id, share.port) != (sandbox_id, port):
            return await self._refuse(scope, receive, send,
                                      _NOT_FOUND if path.startswith(HOST_SHARE_PATH)
                                      else _NO_COOKIE)
        if path.startswith(HOST_SHARE_PATH):  # answered here: the token goes no further
            if scope["type"] != "http":
                return await self._refuse(scope, receive, send, _NO_COOKIE)
            response = RedirectResponse("/", status_code=303)
            if token and not share.public:
                _set_cookie(response, share, token, "/", scope.get("scheme") == "https")
            return await response(scope, receive, send)
        # The host is not passed on: the E2B routing behind would read it as its own.
        inner = {**scope, "path": f"/s/{share.share_id}{path}",
                 "raw_path": f"/s/{share.share_id}{path}".encode(), HOST_SCOPE_KEY: True,
                 "headers": [(k, v) for k, v in scope.get("headers", ()) if k != b"host"]
                 + [(b"host", b"abx-preview.invalid")]}
        await self.app(inner, receive, send)

    async def _refuse(self, scope: Scope, receive: Any, send: Any, text: str,
                      status: int = 401) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4000 + status,
                        "reason": "share link refused"})
            return
        await _refused(status, text)(scope, receive, send)
