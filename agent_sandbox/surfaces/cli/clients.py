"""Where each MCP client keeps its server list, and in what shape."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from agent_sandbox.surfaces.cli.output import UsageError

SERVER_NAME = "agent-sandbox"


def _home() -> Path:
    return Path(os.path.expanduser("~"))


def _app_config_dir(app: str) -> Path:
    """Per-OS application config dir (Claude Desktop, VS Code user profile)."""
    if sys.platform == "darwin":
        return _home() / "Library" / "Application Support" / app
    if sys.platform.startswith("win"):
        return Path(os.environ.get("APPDATA") or _home() / "AppData" / "Roaming") / app
    return Path(os.environ.get("XDG_CONFIG_HOME") or _home() / ".config") / app


@dataclass(frozen=True)
class Target:
    name: str
    label: str
    servers_key: str  # the table holding the servers
    fmt: str = "json"  # or "toml"
    scopes: tuple[str, ...] = ("user",)
    default_scope: str = "user"
    key_scopes: tuple[str, ...] = ()  # scopes whose entry may carry the API key
    extra: dict[str, str] = field(default_factory=dict)  # fixed fields of our entry
    steps: tuple[str, ...] = ()  # what the user must still do after an install
    project_steps: tuple[str, ...] = ()  # and in addition, for a project-scope install

    def next_steps(self, scope: str) -> list[str]:
        return [*self.steps, *(self.project_steps if scope == "project" else ())]

    def path(self, scope: str | None = None) -> Path:
        scope = scope or self.default_scope
        if scope not in self.scopes:
            raise UsageError(f"--target {self.name} has no {scope!r} scope; use "
                             f"{' or '.join(self.scopes)}")
        return _PATHS[(self.name, scope)]()


GEMINI_TRUST = (
    "Gemini CLI connects MCP servers only in trusted folders (with folder trust on, an "
    "untrusted folder lists agent-sandbox as Disabled): run `gemini` in the folder you work "
    "in and choose \"Trust folder\" in the trust dialog, or `/permissions` there to change it "
    "(choices are kept in ~/.gemini/trustedFolders.json)")

TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("cursor", "Cursor", "mcpServers", scopes=("user", "project"), key_scopes=("user",),
           steps=("Restart Cursor (or toggle agent-sandbox off and on in Cursor Settings > "
                  "MCP); it lists the server's tools when it is connected",)),
    Target("claude", "Claude Desktop", "mcpServers", key_scopes=("user",),
           steps=("Quit Claude Desktop completely (closing the window is not enough) and start "
                  "it again: it reads this file only at start",)),
    Target("vscode", "VS Code", "servers", scopes=("project", "user"), default_scope="project",
           extra={"type": "stdio"},
           steps=("Reload the VS Code window (Developer: Reload Window), then start "
                  "agent-sandbox from the Start action in mcp.json or the MCP servers list, and "
                  "confirm that you trust it if VS Code asks",)),
    Target("windsurf", "Windsurf", "mcpServers",
           steps=("Refresh the MCP servers in Windsurf (Cascade's MCP panel), or restart it",)),
    Target("claude-code", "Claude Code", "mcpServers", scopes=("user", "project"),
           extra={"type": "stdio"},
           steps=("Check it with `claude mcp list` (agent-sandbox should be connected); a "
                  "running Claude Code session picks it up after a restart",),
           project_steps=("Claude Code asks once before it uses servers from a project's "
                          ".mcp.json: approve agent-sandbox (or from `/mcp`); `claude mcp "
                          "reset-project-choices` undoes a refusal",)),
    Target("codex", "Codex CLI", "mcp_servers", fmt="toml", scopes=("user", "project"),
           steps=("Start a new Codex session; `codex mcp list` shows agent-sandbox",),
           project_steps=("Codex reads .codex/config.toml only in a trusted project: trust "
                          "this folder when Codex asks",)),
    Target("gemini", "Gemini CLI", "mcpServers", scopes=("user", "project"),
           steps=("Restart Gemini CLI; `/mcp` (or `gemini mcp list`) shows agent-sandbox",
                  GEMINI_TRUST),
           project_steps=("Until the folder is trusted Gemini CLI ignores the project's "
                          ".gemini/settings.json entirely",)),
)}

_PATHS = {
    ("cursor", "user"): lambda: _home() / ".cursor" / "mcp.json",
    ("cursor", "project"): lambda: Path.cwd() / ".cursor" / "mcp.json",
    ("claude", "user"): lambda: _app_config_dir("Claude") / "claude_desktop_config.json",
    ("vscode", "project"): lambda: Path.cwd() / ".vscode" / "mcp.json",
    ("vscode", "user"): lambda: _app_config_dir("Code") / "User" / "mcp.json",
    ("windsurf", "user"): lambda: _home() / ".codeium" / "windsurf" / "mcp_config.json",
    ("claude-code", "user"): lambda: _home() / ".claude.json",
    ("claude-code", "project"): lambda: Path.cwd() / ".mcp.json",
    ("codex", "user"): lambda: Path(os.environ.get("CODEX_HOME") or _home() / ".codex")
    / "config.toml",
    ("codex", "project"): lambda: Path.cwd() / ".codex" / "config.toml",
    ("gemini", "user"): lambda: _home() / ".gemini" / "settings.json",
    ("gemini", "project"): lambda: Path.cwd() / ".gemini" / "settings.json",
}


def target(name: str) -> Target:
    found = TARGETS.get(name)
    if found is None:
        raise UsageError(f"unknown --target {name!r}; choose one of: {', '.join(TARGETS)}")
    return found


def launch_command() -> list[str]:
    """How a client should start ``abx``: this executable's absolute path, else the
    interpreter and module (IDEs start servers with a bare PATH)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 and Path(argv0).name == "abx":
        path = Path(argv0) if os.sep in argv0 else None
        if path is None:
            import shutil

            found = shutil.which(argv0)
            path = Path(found) if found else None
        if path is not None and path.is_file() and os.access(path, os.X_OK):
            return [os.path.abspath(path)]
    return [os.path.abspath(sys.executable), "-m", "agent_sandbox.surfaces.cli"]
