"""Settings of the MCP server, read from ``ABX_MCP_*`` environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

CODE_TEMPLATE = "code-interpreter-v1"  # base plus Python with a Jupyter kernel
# An IDE's local STDIO server is for one agent that wants a notebook; a shared HTTP server
# starts plain sandboxes (run_code still gets a kernel sandbox when it needs one).
DEFAULT_TEMPLATES = {"stdio": CODE_TEMPLATE, "http": "base"}
DEFAULT_TEMPLATE = DEFAULT_TEMPLATES["stdio"]
DEFAULT_OUTPUT_BUDGET = 100 * 1024
DEFAULT_MAX_CONCURRENCY = 32
STDIO_MAX_MESSAGE = 8 * 1024 * 1024


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a whole number, got {raw!r}") from None
    if value <= 0:
        raise SystemExit(f"{name} must be > 0, got {value}")
    return value


def default_audit_path() -> Path:
    return Path(os.path.expanduser("~/.abx/run/audit.log"))


@dataclass
class AgentConfig:
    template: str = DEFAULT_TEMPLATE
    output_budget: int = DEFAULT_OUTPUT_BUDGET
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    # None: every tool; otherwise the raw ABX_MCP_TOOLS spec (see tools.resolve_allowlist).
    tools: str | None = None
    audit_log: Path | None = field(default_factory=default_audit_path)

    @classmethod
    def from_env(cls, transport: str = "stdio") -> AgentConfig:
        audit = os.environ.get("ABX_MCP_AUDIT_LOG")
        return cls(
            template=os.environ.get("ABX_MCP_TEMPLATE", "").strip()
            or DEFAULT_TEMPLATES.get(transport, DEFAULT_TEMPLATE),
            output_budget=_int_env("ABX_MCP_OUTPUT_BUDGET", DEFAULT_OUTPUT_BUDGET),
            max_concurrency=_int_env("ABX_MCP_MAX_CONCURRENCY", DEFAULT_MAX_CONCURRENCY),
            tools=os.environ.get("ABX_MCP_TOOLS") or None,
            # An empty ABX_MCP_AUDIT_LOG turns auditing off.
            audit_log=default_audit_path() if audit is None else (Path(audit) if audit else None),
        )


def warm_pool_for(template: str) -> None:
    """A long-lived server keeps warm sandboxes of the template it creates (set before the
    engine starts; an explicit ABX_POOL_SIZE / ABX_POOL_TEMPLATES wins)."""
    os.environ.setdefault("ABX_POOL_SIZE", "2")
    os.environ.setdefault("ABX_POOL_TEMPLATES", template)
