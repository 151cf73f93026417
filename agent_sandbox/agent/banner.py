"""The startup banner, on stderr (stdout belongs to the protocol)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable


def auth_configured() -> bool:
    return "ABX_MCP_AUTH_TOKEN" in os.environ or "ABX_MCP_AUTH_TOKEN_FILE" in os.environ


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
