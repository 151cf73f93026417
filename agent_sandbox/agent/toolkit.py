"""What every tool is built from: the call context, the output, the spec, argument-schema
pieces and limits, and the shared helpers (the session's default sandbox, output budgets).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agent_sandbox.agent.config import CODE_TEMPLATE, AgentConfig
from agent_sandbox.agent.output import OUTPUT_DIR, cut, split_budget
from agent_sandbox.agent.sessions import SessionState
from agent_sandbox.models import SandboxInfo
from agent_sandbox.sdk import AsyncSandbox

ProgressSink = Callable[[str, str], None]  # (stream name, text); thread-safe, non-blocking


@dataclass
class CallContext:
    session: SessionState
    config: AgentConfig
    call_id: str
    progress: ProgressSink | None = None
    sandbox_id: str | None = None  # the sandbox the call used (for the audit line)


@dataclass
class ToolOutput:
    text: str
    data: dict[str, Any] = field(default_factory=dict)
    # Images to show the model: (base64 data, MIME type), sent as MCP image content.
    images: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[CallContext, dict[str, Any]], Awaitable[ToolOutput]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    properties: dict[str, Any]
    handler: Handler
    required: tuple[str, ...] = ()
    read_only: bool = False
    destructive: bool = False

    def input_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "object", "properties": self.properties,
                                  "additionalProperties": False}
        if self.required:
            schema["required"] = list(self.required)
        return schema

    def accepted(self) -> set[str]:
        return set(self.properties)


# ---- helpers ------------------------------------------------------------------------------

SANDBOX_ID = {"type": "string", "maxLength": 128, "description": "Sandbox to use. Omit to use "
              "this session's default sandbox (created on first use)."}
SANDBOX_ID_REQUIRED = {"type": "string", "maxLength": 128, "description": "The sandbox's id "
                       "(from create_sandbox or list_sandboxes)."}
PATH = {"type": "string", "maxLength": 4096}
MAX_TIMEOUT = 86400  # a day: commands and code cells
MAX_IDLE = 30 * 86400  # the engine's cap on a sandbox's idle timeout
MAX_BYTE = (1 << 53) - 1  # offsets: the largest integer every JSON client keeps exactly
MAX_PID = 1 << 22  # Linux's PID_MAX_LIMIT


def public_info(info: SandboxInfo) -> dict[str, Any]:
    data = info.model_dump(exclude={"envs"})
    data["env_names"] = sorted(info.envs)  # values may be secrets: names only
    data["expires_at"] = info.expires_at
    return data


def describe(info: SandboxInfo) -> str:
    flags = [info.state, f"template {info.template}"]
    if info.persistent:
        flags.append("persistent")
    if info.network:
        flags.append("network")
    return f"{info.sandbox_id} ({', '.join(flags)})"


async def _kernel_template(ctx: CallContext) -> str:
    """The server's template if it has a code kernel, else the code interpreter's."""
    from agent_sandbox.providers.select import default_provider

    templates = await asyncio.to_thread(default_provider().list_templates)
    has_kernel = any(t.name == ctx.config.template and t.has_kernel for t in templates)
    return ctx.config.template if has_kernel else CODE_TEMPLATE


async def sandbox_for(ctx: CallContext, sandbox_id: str | None, *,
                      needs_kernel: bool = False) -> AsyncSandbox:
    """The named sandbox, or the session's default one (created lazily; for run_code from a
    template that has a kernel, so a first run_code on a plain server just works)."""
    if sandbox_id:
        sb = await ctx.session.resolve(sandbox_id)
    else:
        async with ctx.session.create_lock:
            default = ctx.session.default_id
            if default is not None:
                sb = ctx.session.sandboxes[default]
            else:
                template = await _kernel_template(ctx) if needs_kernel else ctx.config.template
                sb = await AsyncSandbox.create(
                    template=template,
                    metadata={"mcp_session": ctx.session.session_id[:64]})
                ctx.session.adopt(sb, persistent=False)
    ctx.sandbox_id = sb.sandbox_id
    return sb


async def save_full(sb: AsyncSandbox, ctx: CallContext, stream: str, text: str) -> str | None:
    path = f"{OUTPUT_DIR}/{ctx.call_id}.{stream}.txt"
    try:
        await sb.files.write(path, text, mode=0o600)
    except Exception:  # noqa: BLE001 - a full disk must not lose the (cut) result itself
        return None
    return path


async def fit_streams(sb: AsyncSandbox, ctx: CallContext, streams: dict[str, str]
                       ) -> tuple[dict[str, str], dict[str, str]]:
    """Cut streams to the budget; returns (cut streams, paths of the saved full copies)."""
    names = list(streams)
    shares = split_budget([len(streams[n]) for n in names], ctx.config.output_budget)
    out: dict[str, str] = {}
    saved: dict[str, str] = {}
    for name, keep in zip(names, shares, strict=True):
        text = streams[name]
        if len(text) > keep:
            path = await save_full(sb, ctx, name, text)
            if path:
                saved[name] = path
            text = cut(text, keep, path)
        out[name] = text
    return out, saved
