"""The MCP server: sandboxes as tools for AI agents, over STDIO or Streamable HTTP."""

from agent_sandbox.agent.server import create_mcp_app

__all__ = ["create_mcp_app"]
