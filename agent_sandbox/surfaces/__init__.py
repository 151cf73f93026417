"""Every way in: MCP, REST, E2B's API, the CLI."""
