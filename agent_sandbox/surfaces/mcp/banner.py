"""The startup banner, on stderr (stdout belongs to the protocol)."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from agent_sandbox.config.settings import Settings


def auth_configured(settings: Settings) -> bool:
    return settings.mcp_auth_token is not None or settings.mcp_auth_token_file is not None


def print_banner(*, transport: str, protocol: str, template: str, tools: Iterable[str],
                 auth: str, stop: str) -> None:
    lines = [
        f"agent-sandbox MCP server ({transport})",
        f"  protocol: {protocol}",
        f"  template: {template}",
        f"  auth:     {auth}",  # whether it is configured, never the secret itself
        f"  tools:    {', '.join(tools)}",
        f"  stop:     {stop}",
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)
