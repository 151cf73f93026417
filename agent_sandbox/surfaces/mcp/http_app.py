"""Streamable HTTP entry point: ``uvicorn agent_sandbox.surfaces.mcp.http_app:asgi_app``.

POST/DELETE /mcp speak MCP (sessions by Mcp-Session-Id), GET /mcp is 405 (no standalone
stream), GET /health reports status. Every POST body is checked first (``wire_guard``: size,
depth, encoding, surrogates, ids, batches) and answered with a JSON-RPC error if bad.
DELETE, idle expiry and shutdown destroy a session's non-persistent sandboxes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Any

import mcp_types as types
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from agent_sandbox.config.settings import Settings, SettingsError
from agent_sandbox.providers.select import use_settings
from agent_sandbox.surfaces import heap
from agent_sandbox.surfaces.mcp import reply_mode, wire_guard
from agent_sandbox.surfaces.mcp.banner import print_banner
from agent_sandbox.surfaces.mcp.config import STDIO_MAX_MESSAGE, AgentConfig, with_warm_pool
from agent_sandbox.surfaces.mcp.http_guard import (
    allowed_origins,
    auth_problem,
    exposure_problem,
    guard_post,
    header,
    is_oauth_discovery,
    load_token,
    origin_ok,
    send_json,
    unauthorized,
    uvicorn_bind_hosts,
)
from agent_sandbox.surfaces.mcp.identity import version
from agent_sandbox.surfaces.mcp.server import AgentServer, create_mcp_app
from agent_sandbox.surfaces.mcp.session_cap import SessionCap

log = logging.getLogger("agent_sandbox.surfaces.mcp")


async def _no_sessionless_era(ctx: Any, params: Any) -> Any:
    raise MCPError(types.METHOD_NOT_FOUND,
                   "this server is sessionful over HTTP: connect with the initialize handshake "
                   "(protocol 2024-11-05 to 2025-11-25)")
HEALTH_PROTOCOL = "2025-06-18"
MCP_PATH = "/mcp"


class MCPHttpApp:
    def __init__(self, settings: Settings) -> None:
        self.config = AgentConfig.from_settings(settings, "http")
        # The sandboxes the tools create (through the SDK) come from an engine made with these.
        use_settings(with_warm_pool(settings, self.config.template))
        self.server: AgentServer = create_mcp_app(config=self.config, transport="http")
        # The sessionless 2026-07-28 era has no session to own sandboxes or to end them:
        # answering discover with "method not found" makes a modern client fall back to
        # the handshake, so every HTTP client gets a session of its own.
        self.server.add_request_handler("server/discover", types.RequestParams,
                                        _no_sessionless_era)
        self.token = load_token(settings)
        reply_mode.install()  # JSON answers where no stream is needed (reply_mode)
        self.origins = allowed_origins(settings)
        self.inner = self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            session_idle_timeout=float(settings.mcp_session_ttl),
            max_sessions=settings.mcp_max_sessions,
            # Origins are checked here (403 with our allowlist); Host pinning would break
            # reverse proxies, and auth is the real gate.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.cap = SessionCap(self.server.session_manager, self.server.runtime.sessions)
        self.started = time.time()
        if self.token is None:
            print("WARNING: ABX_MCP_AUTH_TOKEN is not set: anyone who can reach this port can "
                  "run commands in sandboxes. Bind to 127.0.0.1 only, or set a token.",
                  file=sys.stderr)
        print_banner(
            transport="streamable-http (POST/DELETE /mcp, GET /health)",
            protocol="2024-11-05 ... 2025-11-25 (sessions), 2026-07-28",
            template=self.config.template, tools=self.server.runtime.tools,
            auth=("bearer token: configured" if self.token else
                  "bearer token: SET BUT EMPTY - every request is refused" if self.token == ""
                  else "none"),
            stop="Ctrl-C / SIGTERM (uvicorn)")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if not origin_ok(header(scope, b"origin"), self.origins):
            await send_json(send, 403, {"error": "origin not allowed"})
            return
        # The address this request came in on: an app embedded under a server we could not
        # check at startup still never answers beyond loopback without a token.
        problem = exposure_problem(self.token, [(scope.get("server") or ("127.0.0.1", 0))[0]])
        if problem:
            await send_json(send, 401, {"error": problem})
            return
        path, method = scope["path"].rstrip("/") or "/", scope["method"]
        if is_oauth_discovery(path):
            # Answered before auth: a 401 here would send the client on an OAuth dance.
            await send_json(send, 404, {"error": "this server does not use OAuth: send "
                                        "'Authorization: Bearer <ABX_MCP_AUTH_TOKEN>'"})
            return
        problem = auth_problem(self.token, header(scope, b"authorization"))
        if problem:
            body, challenge = unauthorized(problem)
            await send_json(send, 401, body, challenge)
            return
        if path == "/health":
            await send_json(send, 200, self.health())
        elif path != MCP_PATH:
            await send_json(send, 404, {"error": f"no route {path}; MCP is at {MCP_PATH}"})
        elif method not in ("POST", "DELETE"):
            # No standalone SSE stream: the SDK would answer GET with 400.
            await send_json(send, 405, {"error": "use POST (or DELETE to end a session)"},
                            [(b"allow", b"POST, DELETE")])
        elif method == "POST":
            checked = await guard_post(scope, receive, send, STDIO_MAX_MESSAGE)
            if checked is None:
                return
            if header(scope, b"mcp-session-id") is None and not await self.cap.make_room():
                await send_json(send, 503, wire_guard.error(
                    types.INTERNAL_ERROR, self.cap.refusal()), [(b"retry-after", b"5")])
                return
            as_json = reply_mode.wants_json(header(scope, b"accept"), checked.message)
            with reply_mode.chosen(as_json):
                await self.inner(scope, checked, send)
        else:
            await self.inner(scope, receive, send)

    def health(self) -> dict[str, Any]:
        rt = self.server.runtime
        return {"status": "ok", "version": version(), "protocol": HEALTH_PROTOCOL,
                "uptime_s": round(time.time() - self.started, 1),
                "sessions": len(rt.sessions), "sandboxes": rt.sessions.sandbox_count(),
                "in_flight": rt.in_flight, "last_tool": rt.last_tool}

    async def _lifespan(self, receive: Any, send: Any) -> None:
        # A mounted Starlette app's lifespan does not run: enter the session manager here.
        import anyio

        message = await receive()
        assert message["type"] == "lifespan.startup"
        argv = sys.argv if "uvicorn" in " ".join(sys.argv[:1]) else []
        problem = exposure_problem(self.token, uvicorn_bind_hosts(argv, dict(os.environ)))
        if problem:
            await send({"type": "lifespan.startup.failed", "message": problem})
            return
        # Every SDK call is a blocking engine call in a worker thread: anyio's default of 40
        # threads would queue concurrent tool calls behind each other.
        anyio.to_thread.current_default_thread_limiter().total_tokens = max(
            64, self.config.max_concurrency + 8)
        async with contextlib.AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(self.server.session_manager.run())
            except Exception as exc:  # noqa: BLE001
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            heap.settle()
            await send({"type": "lifespan.startup.complete"})
            message = await receive()  # lifespan.shutdown
            stack.push_async_callback(self._shutdown)
        await send({"type": "lifespan.shutdown.complete"})

    async def _shutdown(self) -> None:
        import anyio

        from agent_sandbox.providers import local

        with anyio.CancelScope(shield=True), anyio.move_on_after(30):
            await self.server.runtime.sessions.end_all()
            await anyio.to_thread.run_sync(local.drain_running_pool)
        self.server.runtime.audit.close()


def _build() -> MCPHttpApp:
    try:
        settings = Settings()  # the one read of the environment in this process
    except SettingsError as exc:
        raise SystemExit(f"agent-sandbox MCP: {exc.message}") from None
    logging.basicConfig(level=settings.log_level, stream=sys.stderr)
    return MCPHttpApp(settings)


asgi_app = _build()
