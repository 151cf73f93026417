"""``abx mcp start`` (STDIO, no options): exec the server without importing the CLI.

Every MCP client config ``abx mcp install`` writes runs exactly ``abx mcp start``, on every
start of the client; the full CLI (typer, rich, the pydantic settings) took ~0.35 s before
the server even began to import. This does the same with the standard library only:

- the ``abx config`` keys the environment leaves blank come from ``./.env``, then
  ``~/.abx/config`` (an unreadable or invalid config file is ignored, as the CLI does);
- ``ABX_MCP_TEMPLATE`` unset takes ``ABX_DEFAULT_TEMPLATE`` when that is set;
- the run record (``mcp-server.json``) is written unless a live server has one;
- then ``execve`` of ``python -m agent_sandbox.surfaces.mcp`` (same pid), which validates its
  settings and reports bad ones itself.

Any other command line goes to the full CLI, and so does this one when the record cannot be
written (the CLI then reports why). The variable names below are those of
``agent_sandbox.config.settings.Settings``; tests/cli/test_stdio_launch.py keeps them equal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from agent_sandbox.surfaces.cli import runstate
from agent_sandbox.surfaces.cli.config_files import (
    ConfigFileError,
    config_path,
    parse_config,
    read_dotenv,
)

ARGV = ("mcp", "start")
SERVER_MODULE = "agent_sandbox.surfaces.mcp"
# abx config key -> its environment variable (Settings fields marked with a config_key).
CONFIG_VARS = {
    "sandbox_api_key": "ABX_SANDBOX_API_KEY",
    "base_url": "ABX_SANDBOX_BASE_URL",
    "region": "SANDBOX_REGION",
    "default_template": "ABX_DEFAULT_TEMPLATE",
    "mcp_template": "ABX_MCP_TEMPLATE",
    "mcp_tools": "ABX_MCP_TOOLS",
}
RUNTIME_DIR_VAR = "ABX_MCP_RUNTIME_DIR"


def stdio_argv() -> list[str]:
    """The STDIO server's command line (this interpreter)."""
    return [sys.executable, "-m", SERVER_MODULE]


def _config_file() -> dict[str, str]:
    try:
        return parse_config(config_path().read_text(), config_path())
    except (OSError, UnicodeDecodeError, ConfigFileError):
        return {}


def server_env(environ: dict[str, str]) -> dict[str, str]:
    """The server's environment: ``environ`` with the blank config keys filled in."""
    env = dict(environ)
    dotenv = read_dotenv()
    config: dict[str, str] | None = None
    for key, var in CONFIG_VARS.items():
        if env.get(var, "").strip():
            continue
        value = dotenv.get(var, "").strip()
        if not value:
            config = _config_file() if config is None else config
            value = config.get(key, "").strip()
        if value:
            env[var] = value
    template = env.get(CONFIG_VARS["mcp_template"], "").strip()
    default = env.get(CONFIG_VARS["default_template"], "").strip()
    if not template and default:
        env[CONFIG_VARS["mcp_template"]] = default
    return env


def runtime_dir(environ: dict[str, str]) -> Path:
    """``ABX_MCP_RUNTIME_DIR``, else ``~/.abx/run`` (the setting's default)."""
    value = environ.get(RUNTIME_DIR_VAR, "").strip()
    return Path(value) if value else Path(os.path.expanduser("~")) / ".abx" / "run"


def exec_server(argv: list[str]) -> None:
    """Become the STDIO server if ``argv`` (after the program name) is exactly
    ``mcp start``; returns (doing nothing lasting) when the full CLI must handle it."""
    if tuple(argv) != ARGV:
        return
    environ = dict(os.environ)
    env = server_env(environ)
    directory = runtime_dir(environ)
    try:
        if runstate.running_record(directory) is None:  # never clobber a live record
            runstate.write_record(os.getpid(), directory, transport="stdio", background=False)
    except OSError:
        return  # the CLI tries again and says what is wrong
    server = stdio_argv()
    try:
        os.execve(server[0], server, env)
    except OSError as exc:
        sys.exit(f"error: cannot start the MCP server ({server[0]}): {exc.strerror}")


__all__ = ["exec_server", "server_env", "stdio_argv"]
