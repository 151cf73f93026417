"""The console's cookie as a caller's identity, for the REST API and the terminal socket.

A request that brings no key of its own (no ``Authorization``, no ``X-API-Key``, not the
daemon's socket) but the console's cookie is the cookie's key, looked up afresh each time
(a revoked key ends its sessions at once). Cross-site forgery gets nowhere:
- the cookie is SameSite=Strict, and a state-changing call (anything but GET, HEAD,
  OPTIONS) must also bring the session's CSRF token in ``X-CSRF-Token``, which a page of
  another origin can neither read nor send without a CORS preflight this gateway refuses;
- a WebSocket (no CORS there) counts only from a page of this very origin (``Origin``);
- a sandbox's port, served on this origin through the gateway, never sees the session:
  to a browser holding the cookie (or any browser, on an open gateway: there the origin
  itself is the authority) its pages run as an opaque origin (CSP sandbox: a page
  of this origin could otherwise read the CSRF token and drive the console), may not set
  the console's cookie, and the port proxy drops cookies on the way in. The price: such a
  preview's own cookies and storage do not work in a browser signed in to the console
  (host-routed previews, ABX_GATEWAY_PREVIEW_URL, are unaffected).
"""

from __future__ import annotations

import hmac
import re
from urllib.parse import urlsplit

import anyio.to_thread
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_sandbox.core.errors import NotFoundError, PermissionDeniedError, SandboxError
from agent_sandbox.surfaces.console.sessions import COOKIE, Sessions
from agent_sandbox.surfaces.http.auth import Principal
from agent_sandbox.surfaces.http.errors import sandbox_error_response
from agent_sandbox.surfaces.http.keys import KeyStore
from agent_sandbox.surfaces.http.peercred import peer_of

SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
CSRF_HEADER = "x-csrf-token"
# Where the cookie stands for its key: the REST API, the console's own API, health.
_COOKIE_PATHS = re.compile(r"^/(v1/|ui/api/|health$|metrics$)")
# A sandbox's server, relayed on this origin: its content is the sandbox's, never the
# console's. The port proxy, and the share links' path-routed previews (/share/TOKEN,
# /s/SHARE/...; host-routed ones are other origins, which a host-only cookie never reaches).
_PORT_PATHS = re.compile(r"^(/v1/sandboxes/[^/]+/(ports|tcp)(/|$)|/s/|/share/)")
# What a sandbox's page may do as an opaque origin: run, but reach nothing of ours.
SANDBOXED = ("sandbox allow-scripts allow-forms allow-popups allow-modals "
             "allow-downloads")
# Sign-in is the one state-changing call before a session: a JSON body (which no form
# can send) from this origin.
LOGIN_PATH = "/ui/api/login"


def cookie_token(headers: Headers) -> str | None:
    """The session token from the Cookie header: starlette's parser (one linear split;
    http.cookies' is quadratic on crafted input before Python 3.11.10, and this runs on
    the event loop for every request)."""
    raw = headers.get("cookie")
    if not raw or COOKIE not in raw:
        return None
    return cookie_parser(raw).get(COOKIE) or None


def same_origin(headers: Headers) -> bool:
    """Whether the request's Origin is this gateway's own host (as the client reached
    it); a request with no Origin (not from a browser page) is not."""
    origin = headers.get("origin")
    host = headers.get("host")
    if not origin or not host:
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


def _confined(send: Send) -> Send:
    """A sandbox's response: an opaque origin, and no say over the console's cookie."""
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            cookies = [v for k, v in message["headers"] if k.lower() == b"set-cookie"]
            del headers["set-cookie"]
            for value in cookies:
                if not value.decode("latin-1").lstrip().startswith(f"{COOKIE}="):
                    headers.append("set-cookie", value.decode("latin-1"))
            headers["content-security-policy"] = SANDBOXED
        await send(message)
    return wrapped


# A page of another site that links to a sandbox's page here: the browser leaves the
# SameSite=Strict cookie off that one navigation, so the response could not be confined
# for the console user it then runs as (its later calls here do carry the cookie). It is
# sent once more from this origin instead, which carries the cookie if the browser has it.
_BOUNCE = (b'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0">'
           b"<title>Opening...</title>")


def _from_another_site(headers: Headers) -> bool:
    return (headers.get("sec-fetch-mode") == "navigate"
            and headers.get("sec-fetch-site") in ("cross-site", "same-site"))


async def _bounce(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/html; charset=utf-8"), (b"cache-control", b"no-store"),
        (b"content-security-policy", b"default-src 'none'"),
        (b"referrer-policy", b"no-referrer"), (b"content-length", str(len(_BOUNCE)).encode())]})
    await send({"type": "http.response.body", "body": _BOUNCE})


class ConsoleSessions:
    def __init__(self, app: ASGIApp, keys: KeyStore, sessions: Sessions) -> None:
        self.app, self.keys, self.sessions = app, keys, sessions
        self._ever_keyed = False

    async def _keyed(self) -> bool:
        """Whether the gateway has keys. An open one (none) answers any caller on its
        loopback origin as an admin, and a sandbox's page relayed there is of that very
        origin: it runs confined, as for a cookie. Once keyed, a gateway stays so."""
        if not self._ever_keyed:
            self._ever_keyed = await anyio.to_thread.run_sync(self.keys.any_keys)
        return self._ever_keyed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path = scope["path"]
        if _PORT_PATHS.match(path):
            if scope["type"] == "http" and _from_another_site(headers):
                await _bounce(send)
                return
            if scope["type"] == "http" and (cookie_token(headers) is not None
                                            or not await self._keyed()):
                send = _confined(send)
            await self.app(scope, receive, send)
            return
        token = cookie_token(headers)
        if (token is None or not _COOKIE_PATHS.match(path) or peer_of(scope) is not None
                or "authorization" in headers or "x-api-key" in headers):
            await self.app(scope, receive, send)
            return
        try:
            who = await anyio.to_thread.run_sync(self._principal, token)
            if who is not None:
                self._check_forgery(scope, headers, token)
        except SandboxError as exc:
            response = sandbox_error_response(exc)
            if scope["type"] == "http":
                await response(scope, receive, send)
            else:
                await send({"type": "websocket.http.response.start",
                            "status": response.status_code, "headers": response.raw_headers})
                await send({"type": "websocket.http.response.body", "body": response.body})
            return
        if who is not None:  # in place: outer layers (metrics) read what routing adds
            scope.update({"abx.principal": who, "abx.console": token})
        await self.app(scope, receive, send)

    def _principal(self, token: str) -> Principal | None:
        """The session's key while it is live; None (an anonymous caller) otherwise."""
        session = self.sessions.get(token)
        if session is None:
            return None
        try:
            key = self.keys.get(session.key_id)
        except NotFoundError:
            key = None
        if key is None or key.revoked:
            self.sessions.close(token)
            return None
        return Principal(key)

    def _check_forgery(self, scope: Scope, headers: Headers, token: str) -> None:
        if scope["type"] == "websocket":
            if not same_origin(headers):
                raise PermissionDeniedError("a console session opens a WebSocket only from "
                                            "a page of this gateway")
            return
        if scope["method"] in SAFE:
            return
        session = self.sessions.get(token)
        sent = headers.get(CSRF_HEADER, "")
        if session is None or not hmac.compare_digest(sent.encode(), session.csrf.encode()):
            raise PermissionDeniedError(
                "a console session's change needs its CSRF token in X-CSRF-Token (the "
                "console sends it; GET /ui/api/me gives it)")
