"""Around every request handler: the handshake gate, and errors a client can act on.

``wire_guard`` has already checked the envelope; this middleware sees each request after
the SDK decoded it and makes sure that

* a request sent before ``initialize`` (on a handshake-era connection) gets a clear
  -32600 naming what to do, not the SDK's bare "Invalid request parameters";
* malformed params get -32602 naming the fields (pydantic's text, never the input);
* an unknown method gets -32601 naming it;
* anything else a handler raises becomes a one-line -32603: no traceback, no exception
  class, no ``str()`` of an arbitrary exception on the wire.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND
from pydantic import ValidationError

from agent_sandbox.core.errors import SandboxError

log = logging.getLogger("agent_sandbox.surfaces.mcp")

# Served before the handshake completes.
_BEFORE_INIT = frozenset({"initialize", "ping"})
Middleware = Callable[[ServerRequestContext[Any, Any], CallNext], Any]


def show(text: str, limit: int = 80) -> str:
    """A name from the client, safe to put in a message: ASCII, quoted, capped."""
    return ascii(text if len(text) <= limit else text[:limit] + "...")


def params_problem(exc: ValidationError, method: str) -> str:
    """-32602 text naming the bad fields, without echoing their values."""
    parts = []
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    for err in errors[:3]:
        loc = ".".join(show(p, 40).strip("'") if isinstance(p, str) else str(p)
                       for p in err["loc"]) or "params"
        parts.append(f"{loc}: {err['msg']}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return f"Invalid params for {show(method)}: {'; '.join(parts)}{more}"[:600]


def _initialized(ctx: ServerRequestContext[Any, Any]) -> bool:
    # The per-client Connection has no public accessor in mcp 2.3 (see server._connection);
    # a modern-era connection is born initialized.
    conn = getattr(ctx.session, "_connection", None)
    return bool(getattr(conn, "initialize_accepted", True))


def make_request_guard(serves: Callable[[str], bool]) -> Middleware:
    """The middleware; ``serves(method)`` says whether the server has a handler for it."""

    async def guard(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        method = ctx.method
        if ctx.request_id is None:  # a notification: never answered, the SDK drops bad ones
            return await call_next(ctx)
        if method not in _BEFORE_INIT and serves(method) and not _initialized(ctx):
            raise MCPError(INVALID_REQUEST, f"Invalid Request: the session is not initialized; "
                           f"send 'initialize' (then 'notifications/initialized') before "
                           f"{show(method)}")
        try:
            return await call_next(ctx)
        except MCPError as exc:
            if exc.error.code == METHOD_NOT_FOUND and exc.error.message == "Method not found":
                hint = "; it is a notification: send it without an 'id'" if \
                    method.startswith("notifications/") else ""
                raise MCPError(METHOD_NOT_FOUND, f"Method not found: {show(method)}{hint}",
                               method if len(method) <= 200 else None) from None
            raise
        except ValidationError as exc:
            raise MCPError(INVALID_PARAMS, params_problem(exc, method)) from None
        except SandboxError as exc:  # e.g. a sessionless HTTP request: a message to act on
            raise MCPError(INVALID_REQUEST, exc.message[:2000]) from None
        except Exception:  # noqa: BLE001 - a bug must still answer cleanly
            log.exception("handler for %s failed", show(method))
            raise MCPError(INTERNAL_ERROR, f"Internal error while handling {show(method)}; "
                           "the server log has details") from None

    return guard
