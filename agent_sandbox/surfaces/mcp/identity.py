"""Who the MCP server says it is: one definition for the SDK server and the early
``initialize`` answer (``early_stdio``), which must not import the SDK."""

from __future__ import annotations

from typing import Any

SERVER_NAME = "agent-sandbox"
INSTRUCTIONS = (
    "Isolated Linux sandboxes for running commands and editing files. Just call run_command, "
    "read_file, write_file or list_files: a default sandbox is created on first use and "
    "destroyed when this session ends (unless created with persistent=true).")
# What `initialize` advertises: the tool list is fixed for the server's life.
CAPABILITIES: dict[str, Any] = {"tools": {"listChanged": False}}


def version() -> str:
    from agent_sandbox import __version__

    return __version__
