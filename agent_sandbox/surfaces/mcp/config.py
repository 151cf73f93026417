"""Settings of the MCP server: its part of ``agent_sandbox.config.settings.Settings``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent_sandbox.config.settings import Settings
from agent_sandbox.core.network import NetworkPolicy, parse
from agent_sandbox.core.templates import CODE_INTERPRETER

CODE_TEMPLATE = CODE_INTERPRETER
BASE_TEMPLATE = "base"
# An IDE's local STDIO server is for one agent that wants a notebook; a shared HTTP server
# starts plain sandboxes (run_code still gets a kernel sandbox when it needs one). The
# code interpreter is a default only once built: until then sandboxes for anything but
# run_code start from base (toolkit.default_template), so they work offline.
DEFAULT_TEMPLATES = {"stdio": CODE_TEMPLATE, "http": BASE_TEMPLATE}
DEFAULT_TEMPLATE = DEFAULT_TEMPLATES["stdio"]
DEFAULT_OUTPUT_BUDGET: int = Settings.model_fields["mcp_output_budget"].default
DEFAULT_MAX_CONCURRENCY: int = Settings.model_fields["mcp_max_concurrency"].default
DEFAULT_SESSION_CONCURRENCY: int = Settings.model_fields["mcp_session_concurrency"].default
STDIO_MAX_MESSAGE = 8 * 1024 * 1024
WARM_POOL_SIZE = 2


def default_audit_path() -> Path:
    return Path(Settings.model_fields["mcp_audit_log"].get_default(call_default_factory=True))


@dataclass
class AgentConfig:
    template: str = DEFAULT_TEMPLATE
    output_budget: int = DEFAULT_OUTPUT_BUDGET
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    session_concurrency: int = DEFAULT_SESSION_CONCURRENCY
    # None: every tool; otherwise the raw ABX_MCP_TOOLS spec (see tools.resolve_allowlist).
    tools: str | None = None
    audit_log: Path | None = field(default_factory=default_audit_path)
    # ABX_MCP_NETWORK_CEILING: the most network a tool call may give a sandbox.
    network_ceiling: NetworkPolicy = field(default_factory=lambda: parse(
        Settings.model_fields["mcp_network_ceiling"].default))

    @classmethod
    def from_settings(cls, settings: Settings | None = None,
                      transport: str = "stdio") -> AgentConfig:
        settings = settings or Settings()
        return cls(
            template=settings.mcp_template or DEFAULT_TEMPLATES.get(transport, DEFAULT_TEMPLATE),
            output_budget=settings.mcp_output_budget,
            max_concurrency=settings.mcp_max_concurrency,
            session_concurrency=settings.mcp_session_concurrency,
            tools=settings.mcp_tools,
            audit_log=settings.mcp_audit_log,  # None: auditing off
            network_ceiling=settings.mcp_ceiling,
        )


def with_warm_pool(settings: Settings, template: str) -> Settings:
    """A long-lived server keeps warm sandboxes of the template it creates (an explicit
    ABX_POOL_SIZE / ABX_POOL_TEMPLATES wins)."""
    update: dict[str, object] = {}
    if "pool_size" not in settings.model_fields_set:
        update["pool_size"] = WARM_POOL_SIZE
    if "pool_templates" not in settings.model_fields_set:
        update["pool_templates"] = (template,)
    return settings.model_copy(update=update)
