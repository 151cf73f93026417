"""The HTTP front door: auth, Origin checks, /health, method rules and the POST body check
around the MCP app."""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio

from agent_sandbox.config.settings import Settings
from agent_sandbox.surfaces.mcp import wire_guard
from agent_sandbox.surfaces.mcp.wire_guard import HTTP_DEFAULT_VERSION, settle_initialize

Scope = dict[str, Any]
ASGIApp = Callable[..., Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
_CHECK_IN_THREAD = 256 * 1024


def load_token(settings: Settings) -> str | None:
    """The bearer token; "" (set but empty) means deny everything. None: no auth."""
    if settings.mcp_auth_token is not None:
        return settings.mcp_auth_token
    path = settings.mcp_auth_token_file
    if path is not None:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return ""  # unreadable token file: fail closed
    return None


def allowed_origins(settings: Settings) -> set[str]:
    return {o.rstrip("/") for o in settings.mcp_allowed_origins}


def origin_ok(origin: str | None, extra: set[str]) -> bool:
    if origin is None:
        return True  # not a browser
    if origin.rstrip("/") in extra or "*" in extra:
        return True
    host = urlsplit(origin).hostname
    return host is not None and (host in LOCAL_HOSTS or host.endswith(".localhost"))


def token_ok(expected: str | None, header: str | None) -> bool:
    if expected is None:
        return True
    if not expected or not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[7:].strip().encode(), expected.encode())


def auth_problem(expected: str | None, header: str | None) -> str | None:
    """What is wrong with a request's credentials, in words a person can act on (None: ok)."""
    if token_ok(expected, header):
        return None
    if expected == "":
        return ("unauthorized: this server's token is set but empty, so every request is "
                "refused; set ABX_MCP_AUTH_TOKEN to a real token on the server")
    if not header:
        return ("unauthorized: missing bearer token; send the header 'Authorization: Bearer "
                "<token>' with the server's ABX_MCP_AUTH_TOKEN (this server does not use OAuth)")
    if not header.startswith("Bearer "):
        return "unauthorized: the Authorization header must be 'Bearer <token>'"
    return ("unauthorized: wrong bearer token; use the server's ABX_MCP_AUTH_TOKEN (this "
            "server does not use OAuth)")


def unauthorized(problem: str) -> tuple[dict[str, Any], list[tuple[bytes, bytes]]]:
    """A 401's body (a JSON-RPC error, so MCP clients show its message) and its challenge.

    RFC 6750's challenge without ``resource_metadata``, and no OAuth metadata served (see
    ``is_oauth_discovery``): a client has nothing to start an OAuth flow with.
    """
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": problem}}
    detail = problem.replace('"', "'").encode("ascii", "replace")
    challenge = b'Bearer realm="agent-sandbox", error="invalid_token", error_description="' \
        + detail + b'"'
    return body, [(b"www-authenticate", challenge)]


def is_oauth_discovery(path: str) -> bool:
    """OAuth metadata (RFC 8414, RFC 9728) and registration paths: we serve no OAuth."""
    return path.startswith("/.well-known/") or path in ("/register", "/authorize", "/token")


async def send_json(send: Callable[..., Any], status: int, body: Any,
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def uvicorn_bind_hosts(argv: list[str], environ: dict[str, str]) -> list[str]:
    """The TCP hosts the uvicorn command line asks for ([] for a unix socket or an fd).

    The ASGI app never sees its listening socket before it serves, so the refusal to start
    reads what uvicorn was told; requests are checked again one by one (see below).
    """
    hosts: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--host" and i + 1 < len(argv):
            hosts.append(argv[i + 1])
        elif arg.startswith("--host="):
            hosts.append(arg.split("=", 1)[1])
        elif arg in ("--uds", "--fd") or arg.startswith(("--uds=", "--fd=")):
            return []
    if not hosts:
        hosts.append(environ.get("UVICORN_HOST", "127.0.0.1"))
    return hosts


def exposure_problem(token: str | None, hosts: list[str]) -> str | None:
    """Why serving on ``hosts`` with this token would be unsafe (None: it is fine)."""
    from agent_sandbox.surfaces.loopback import is_loopback

    if token is not None:
        return None
    exposed = [h for h in hosts if not is_loopback(h)]
    if not exposed:
        return None
    return (f"refusing to serve on {', '.join(exposed)} without a token: anyone who can reach "
            "it could run commands in sandboxes. Set ABX_MCP_AUTH_TOKEN (or "
            "ABX_MCP_AUTH_TOKEN_FILE), or bind to 127.0.0.1")


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, bool] | None:
    """The request body and whether it fits in ``limit`` (only its head if it does not);
    None if the client went away."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            return bytes(body[:1024]), False
        if not message.get("more_body", False):
            return bytes(body), True


class CheckedPost:
    """A POST body that passed ``wire_guard``: ``message`` (parsed), and itself an ASGI
    ``receive`` that replays it to the MCP app."""

    def __init__(self, message: Any, receive: Receive) -> None:
        self.message = message
        # The SDK parses what we checked (the same message, so no second opinion on it).
        self._body: bytes | None = json.dumps(message, ensure_ascii=False).encode()
        self._receive = receive

    async def __call__(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        return await self._receive()  # type: ignore[no-any-return]


async def guard_post(scope: Scope, receive: Receive, send: Callable[..., Any],
                     limit: int) -> CheckedPost | None:
    """Check a POST body with ``wire_guard`` before the SDK sees it.

    Bad input is answered here (400 with the JSON-RPC error, 413 when too large) and None
    returned; otherwise the checked message, to replay to the MCP app.
    """
    declared = header(scope, b"content-length")
    too_big = declared is not None and declared.strip().isdigit() and int(declared) > limit
    # Declared too large: read just enough to find the id to answer.
    read = await _read_body(receive, 1024 if too_big else limit)
    if read is None:
        return None
    raw, fits = read
    if not fits or too_big:
        await send_json(send, 413, wire_guard.error(
            wire_guard.INVALID_REQUEST, f"Invalid Request: message larger than {limit} bytes",
            wire_guard.id_near_start(raw)))
        return None
    where = "in a POST of its own"
    if len(raw) > _CHECK_IN_THREAD:
        verdict = await anyio.to_thread.run_sync(wire_guard.inspect, raw, limit, where)
    else:
        verdict = wire_guard.inspect(raw, limit, where)
    if verdict.message is None:
        await send_json(send, 400, verdict.reply)
        return None
    msg = verdict.message
    if isinstance(msg, dict) and msg.get("method") == "initialize":
        # `{"params":{}}`, as documented for curl, is served with what a bare one lacks.
        settle_initialize(msg, HTTP_DEFAULT_VERSION)
    return CheckedPost(msg, receive)
