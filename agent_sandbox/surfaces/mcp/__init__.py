"""The MCP server: sandboxes as tools for AI agents, over STDIO or Streamable HTTP."""

from __future__ import annotations

from typing import Any

__all__ = ["create_mcp_app"]


def __getattr__(name: str) -> Any:
    # Lazy: importing a submodule (the CLI reads agent.config) must not load the MCP SDK.
    if name == "create_mcp_app":
        from agent_sandbox.surfaces.mcp.server import create_mcp_app

        return create_mcp_app
    raise AttributeError(name)
