"""The ``abx`` command line: MCP client setup, the MCP server, sandboxes, templates, doctor."""
