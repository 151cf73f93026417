"""The MCP server object: tool listing, gating, overload control, errors, audit.

Transport-independent: ``mcp.py`` serves it over STDIO, ``mcp_http.py`` over Streamable
HTTP. A client session is keyed by the transport's session id (HTTP) or is the whole
process (STDIO, where ``session_key`` is fixed).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import time
from collections.abc import Sequence
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

from agent_sandbox.core.audit import AuditLog
from agent_sandbox.core.errors import LockedError, NotFoundError, SandboxError, WrongStateError
from agent_sandbox.surfaces.mcp.config import AgentConfig
from agent_sandbox.surfaces.mcp.fairness import CallGate, ServerBusy
from agent_sandbox.surfaces.mcp.identity import INSTRUCTIONS, SERVER_NAME, version
from agent_sandbox.surfaces.mcp.progress import ProgressStreamer
from agent_sandbox.surfaces.mcp.request_guard import make_request_guard
from agent_sandbox.surfaces.mcp.sessions import SessionRegistry, SessionState
from agent_sandbox.surfaces.mcp.tool_results import OUTPUT_SCHEMAS
from agent_sandbox.surfaces.mcp.tools import CallContext, ToolOutput, ToolSpec, resolve_allowlist

log = logging.getLogger("agent_sandbox.surfaces.mcp")
# Trace ids: unique without a getrandom() call per tool call (a random per-process prefix,
# then a counter); 32 hex digits like uuid4().hex.
_trace = [secrets.token_hex(8), itertools.count()]


def _new_trace_prefix() -> None:
    _trace[:] = [secrets.token_hex(8), itertools.count()]


os.register_at_fork(after_in_child=_new_trace_prefix)  # a forked worker never repeats ids


def new_trace_id() -> str:
    return f"{_trace[0]}{next(_trace[1]):016x}"  # type: ignore[call-overload]


class AgentRuntime:
    """Everything the tool handler needs besides the SDK: settings, sessions, counters."""

    def __init__(self, config: AgentConfig, tools: Sequence[ToolSpec], transport: str,
                 audit: AuditLog) -> None:
        self.config = config
        self.tools = {t.name: t for t in tools}
        self.transport = transport
        self.audit = audit
        self.sessions = SessionRegistry(transport)
        self.gate = CallGate.for_server(config, transport)  # caps, per-session shares
        self.started = time.time()
        self.last_tool: dict[str, Any] | None = None

    @property
    def in_flight(self) -> int:
        return self.gate.running


class AgentServer(Server[Any]):
    runtime: AgentRuntime


def _connection(ctx: ServerRequestContext[Any, Any]) -> Any:
    # The SDK hands low-level handlers a ServerSession; the per-client Connection (session
    # id, exit_stack for teardown) sits behind it with no public accessor in mcp 2.3.
    return ctx.session._connection  # noqa: SLF001


def session_for(runtime: AgentRuntime, ctx: ServerRequestContext[Any, Any]) -> SessionState:
    """This request's session state; an HTTP session's sandboxes die with the session."""
    conn = _connection(ctx)
    if runtime.transport == "http" and not conn.session_id:
        # Sessionless HTTP would pool every client's sandboxes together: refuse.
        raise WrongStateError("this HTTP server needs a session: connect with the initialize "
                              "handshake and send its Mcp-Session-Id")
    key = conn.session_id or runtime.transport
    state, new = runtime.sessions.get(key)
    state.last_seen = time.monotonic()
    if new and conn.session_id:
        # Unwound by the SDK on DELETE, idle expiry and shutdown.
        conn.exit_stack.push_async_callback(runtime.sessions.end, key)
    return state


def _result(out: ToolOutput, is_error: bool = False) -> types.CallToolResult:
    content: list[Any] = [types.TextContent(text=out.text)]
    content += [types.TextContent(text=note) for note in out.notes]
    content += [types.ImageContent(data=data, mime_type=mime) for data, mime in out.images]
    # A field that does not apply is left out, never null: output schemas give every
    # property one type, and a strict dialect has no nullable one (tool_results).
    data = {k: v for k, v in out.data.items() if v is not None}
    return types.CallToolResult(content=content, structured_content=data, is_error=is_error)


MAX_ERROR_MESSAGE = 2000  # an error quoting a huge argument back is cut


def error_result(exc: SandboxError) -> types.CallToolResult:
    message = exc.message
    if len(message) > MAX_ERROR_MESSAGE:
        message = message[:MAX_ERROR_MESSAGE] + "... [message cut]"
    err: dict[str, Any] = {"code": exc.code, "message": message, "details": exc.details}
    retry_after = exc.retry_after if isinstance(exc, LockedError) else \
        _seconds(exc.details.get("retry_after"))
    if retry_after is not None:
        err["retry_after"] = retry_after  # typed in every output schema (tool_results)
    return _result(ToolOutput(f"Error [{exc.code}]: {message}", {"error": err}), True)


def _seconds(value: Any) -> float | None:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if 0 <= seconds < 1e9 else None  # NaN and the infinities fail too


def _internal_error(tool: str, call_id: str) -> types.CallToolResult:
    return error_result(SandboxError(f"internal error in {tool}; the server log has details "
                                     f"(trace id {call_id})"))


def create_mcp_app(template: str | None = None, tools: str | Sequence[str] | None = None, *,
                   config: AgentConfig | None = None, transport: str = "stdio",
                   audit: AuditLog | None = None) -> AgentServer:
    """Build the MCP server. ``template``/``tools`` override the ``ABX_MCP_*`` settings."""
    config = config or AgentConfig.from_settings()
    if template:
        config.template = template
    if tools is not None:
        config.tools = tools if isinstance(tools, str) else ",".join(tools)
    allowed = resolve_allowlist(config.tools)
    runtime = AgentRuntime(config, allowed, transport, audit or AuditLog(config.audit_log))
    listing = [
        types.Tool(name=t.name, description=t.description_for(config),
                   input_schema=t.input_schema(),
                   output_schema=OUTPUT_SCHEMAS[t.name],
                   annotations=types.ToolAnnotations(read_only_hint=t.read_only,
                                                     destructive_hint=t.destructive))
        for t in allowed
    ]

    async def on_list_tools(ctx: ServerRequestContext[Any, Any],
                            params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listing)

    async def on_call_tool(ctx: ServerRequestContext[Any, Any],
                           params: types.CallToolRequestParams) -> types.CallToolResult:
        return await _call_tool(runtime, ctx, params)

    server = AgentServer(SERVER_NAME, version=version(), instructions=INSTRUCTIONS,
                         on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    server.runtime = runtime

    async def track_sessions(ctx: ServerRequestContext[Any, Any], call_next: CallNext
                             ) -> HandlerResult:
        # Register HTTP sessions on their first request so /health counts them and DELETE
        # cleans up even a session that never called a tool.
        if _connection(ctx).session_id and ctx.method != "initialize":
            session_for(runtime, ctx)
        return await call_next(ctx)

    server.middleware.append(track_sessions)
    # Outermost: it also sees what track_sessions raises.
    server.middleware.insert(0, make_request_guard(
        lambda method: server.get_request_handler(method) is not None))
    return server


async def _call_tool(runtime: AgentRuntime, ctx: ServerRequestContext[Any, Any],
                     params: types.CallToolRequestParams) -> types.CallToolResult:
    started = time.monotonic()
    call_id = new_trace_id()
    args = params.arguments or {}
    spec = runtime.tools.get(params.name)
    out: ToolOutput | None = None
    result: types.CallToolResult
    status = "ok"
    code: str | None = None
    session: SessionState | None = None
    call: CallContext | None = None
    try:
        session = session_for(runtime, ctx)
        call = CallContext(session=session, config=runtime.config, call_id=call_id)
        if spec is None:
            raise NotFoundError(f"unknown tool {params.name!r}; available tools: "
                                f"{', '.join(runtime.tools)}")
        async with runtime.gate.admit(session.session_id):
            out = await _run(spec, call, args, ctx)
        result = _result(out)
        result.model_dump_json(by_alias=True)  # a result that cannot go on the wire is a bug
    except SandboxError as exc:
        status = "busy" if isinstance(exc, ServerBusy) else "error"
        code = exc.code
        result = error_result(exc)
    except Exception:  # noqa: BLE001 - a bug must still answer the model (no traceback)
        log.exception("tool %s failed (trace id %s)", ascii(params.name[:80]), call_id)
        status, code = "error", "internal"
        result = _internal_error(ascii(params.name[:80]), call_id)
    except anyio.get_cancelled_exc_class():
        # The client cancelled it (or the session ended): never answered, but recorded;
        # what it started is being stopped (``agent_sandbox.core.cancel``).
        _audit(runtime, call_id, session, call, params.name, args, started, "cancelled",
               "cancelled", None)
        raise
    _audit(runtime, call_id, session, call, params.name, args, started, status, code, result)
    return result


def _audit(runtime: AgentRuntime, call_id: str, session: SessionState | None,
           call: CallContext | None, tool: str, args: dict[str, Any], started: float,
           status: str, code: str | None, result: types.CallToolResult | None) -> None:
    duration = round((time.monotonic() - started) * 1000, 2)
    name = tool[:200]
    runtime.last_tool = {"name": name, "status": status, "at": time.time(),
                         "duration_ms": duration}
    if not runtime.audit.enabled:
        return  # nothing to record: skip measuring the input and output
    text = result.content[0].text if result and result.content else ""  # type: ignore[union-attr]
    runtime.audit.record(
        trace_id=call_id, session_id=session.session_id if session else None,
        transport=runtime.transport, tool=name,
        sandbox_id=call.sandbox_id if call else None, status=status, duration_ms=duration,
        error_code=code, input_bytes=len(json.dumps(args, default=str)),
        output_bytes=len(text.encode()))


async def _run(spec: ToolSpec, call: CallContext, args: dict[str, Any],
               ctx: ServerRequestContext[Any, Any]) -> ToolOutput:
    token = (ctx.meta or {}).get("progress_token")
    if token is None:
        return await spec.call(call, args)

    async def send(progress: float, message: str) -> None:
        await ctx.session.report_progress(progress, None, message)

    streamer = ProgressStreamer(send)
    call.progress = streamer.push
    try:
        return await spec.call(call, args)
    finally:
        await streamer.close()
