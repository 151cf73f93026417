"""What every tool is built from: the call context, the output, the spec, and the shared
helpers (the session's default sandbox, output budgets).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agent_sandbox.core.errors import NotFoundError, RuntimeUnavailableError, WrongStateError
from agent_sandbox.core.models import SandboxInfo, TemplateInfo
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.network import parse as parse_policy
from agent_sandbox.sdk import AsyncSandbox
from agent_sandbox.sdk.twin import in_thread
from agent_sandbox.surfaces.mcp.args import ToolArgs, parse_args, tool_schema
from agent_sandbox.surfaces.mcp.config import BASE_TEMPLATE, CODE_TEMPLATE, AgentConfig
from agent_sandbox.surfaces.mcp.output import OUTPUT_DIR, cut, split_budget
from agent_sandbox.surfaces.mcp.sessions import SessionState

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
    # Text for the model after ``text`` (a read's version), in blocks of its own so
    # ``text`` stays exactly what it stands for (a file's content).
    notes: list[str] = field(default_factory=list)


# (call context, the tool's checked arguments: an instance of its ToolSpec.args)
Handler = Callable[[CallContext, Any], Awaitable[ToolOutput]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    args: type[ToolArgs]  # the one definition of its arguments: schema and check
    handler: Handler
    read_only: bool = False
    destructive: bool = False

    def description_for(self, config: AgentConfig) -> str:
        """The description clients see: ``{network_ceiling}`` is this server's."""
        return self.description.replace("{network_ceiling}",
                                        ceiling_text(config.network_ceiling))

    def input_schema(self) -> dict[str, Any]:
        return tool_schema(self.args)

    async def call(self, ctx: CallContext, raw: dict[str, Any] | None) -> ToolOutput:
        return await self.handler(ctx, parse_args(self.name, self.args, raw))


# ---- helpers ------------------------------------------------------------------------------

def public_info(info: SandboxInfo) -> dict[str, Any]:
    data = info.model_dump(exclude={"envs"})
    data["env_names"] = sorted(info.envs)  # values may be secrets: names only
    data["network"] = parse_policy(info.network).model_dump(mode="json")
    data["expires_at"] = info.expires_at
    if info.ends_at is not None:
        data["ends_at"] = info.ends_at
    return {k: v for k, v in data.items() if v is not None}  # never null: left out


def ceiling_text(ceiling: NetworkPolicy) -> str:
    """A ceiling as the model reads it in a tool description."""
    if ceiling.mode == "off":
        return "'off' (this server gives sandboxes no network at all)"
    if ceiling.mode == "full":
        return "'full'" + (f" except {', '.join(ceiling.deny_out)}" if ceiling.deny_out else "")
    return "'" + ",".join(ceiling.allow_out) + "'" + (
        f" (except {', '.join(ceiling.deny_out)})" if ceiling.deny_out else "") + \
        " or any part of it"


def check_network(ctx: CallContext, policy: NetworkPolicy) -> None:
    """The model cannot give a sandbox more network than the operator's ceiling."""
    policy.check_within(ctx.config.network_ceiling, "this MCP server's operator",
                        "only the operator can raise it: ABX_MCP_NETWORK_CEILING, or `abx mcp "
                        "start --network-ceiling POLICY`")


def describe(info: SandboxInfo) -> str:
    flags = [info.state, f"template {info.template}"]
    if info.persistent:
        flags.append("persistent")
    network = parse_policy(info.network)
    if network.mode != "off":
        flags.append(f"network {network.describe()}")
    return f"{info.sandbox_id} ({', '.join(flags)})"


async def built_templates() -> list[TemplateInfo]:
    """The templates there are now (this host's, or those the gateway shows this key)."""
    from agent_sandbox.providers.select import default_provider

    return await in_thread(default_provider().list_templates)


async def _built_templates() -> dict[str, bool]:
    """The templates there are now (name: has a kernel)."""
    return {t.name: t.has_kernel for t in await built_templates()}


async def default_template(ctx: CallContext, *, needs_kernel: bool = False) -> str:
    """The template of a sandbox made without being told which: the server's. For run_code,
    one with a kernel (the code interpreter's, built on demand if need be). For anything
    else the code interpreter only once it is built here, else base: building it takes a
    minute, and cannot work where the package index is unreachable."""
    template = ctx.config.template
    if (template == CODE_TEMPLATE) == needs_kernel:
        return template  # nothing to look up (listing templates assembles base)
    built = await _built_templates()
    if needs_kernel:
        return template if built.get(template) else CODE_TEMPLATE
    return template if template in built else BASE_TEMPLATE


async def _create(ctx: CallContext, template: str) -> AsyncSandbox:
    try:
        return await AsyncSandbox.create(
            template=template, metadata={"mcp_session": ctx.session.session_id[:64]})
    except RuntimeUnavailableError as exc:
        if template != CODE_TEMPLATE:
            raise
        # Most often: the kernel template cannot be built here (index unreachable).
        raise RuntimeUnavailableError(
            f"{exc.message}. Or set ABX_MCP_TEMPLATE to a template that has a kernel. "
            "run_command and the file tools work meanwhile (their sandboxes start from "
            f"{BASE_TEMPLATE}).", details=exc.details) from None


async def _no_kernel(ctx: CallContext, sandbox_id: str) -> None:
    """run_code on a default sandbox from base (made so while the code interpreter was
    not built): say how to get a kernel instead of only that base has none."""
    start = (f"run_code needs a Python kernel; this session's default sandbox {sandbox_id} "
             f"runs template {BASE_TEMPLATE}, which has none")
    if (await _built_templates()).get(CODE_TEMPLATE):
        raise WrongStateError(
            f"{start}. Make one that has: create_sandbox with template {CODE_TEMPLATE}, and "
            "pass its sandbox_id to run_code (or use run_command with python3 -c '...')",
            details={"alternative": "create_sandbox"})
    raise WrongStateError(
        f"{start}, and {CODE_TEMPLATE} is not built on this host. Build it: `abx template "
        f"build {CODE_TEMPLATE} --index-url URL` (an index this host can reach; as root it "
        "is built once for every user), or set ABX_MCP_TEMPLATE to a template that has a "
        "kernel; then create_sandbox with it and pass its sandbox_id. Meanwhile "
        "run_command with python3 -c '...' works.", details={"alternative": "run_command"})


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
                if needs_kernel and sb._info.template == BASE_TEMPLATE:
                    await _no_kernel(ctx, sb.sandbox_id)
            else:
                sb = await _create(ctx, await default_template(ctx, needs_kernel=needs_kernel))
                ctx.session.adopt(sb, persistent=False)
    ctx.sandbox_id = sb.sandbox_id
    return sb


async def existing_sandbox(ctx: CallContext, sandbox_id: str | None) -> AsyncSandbox:
    """The named sandbox, or the session's default one; never creates one (pausing or
    killing a sandbox made just for that would be pointless)."""
    if sandbox_id:
        sb = await ctx.session.resolve(sandbox_id)
    elif ctx.session.default_id is not None:
        sb = ctx.session.sandboxes[ctx.session.default_id]
    else:
        raise NotFoundError("this session has no default sandbox yet (it is made by "
                            "create_sandbox or the first run_command, run_code or file tool); "
                            "pass sandbox_id, see list_sandboxes")
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
