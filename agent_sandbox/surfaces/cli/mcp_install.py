"""``abx mcp install|uninstall``: our server entry in each MCP client's config file."""

from __future__ import annotations

from typing import Any

from agent_sandbox.config.settings import env_name
from agent_sandbox.surfaces.cli.clients import SERVER_NAME, TARGETS, Target, launch_command, target
from agent_sandbox.surfaces.cli.merge import merge_write, read_entry
from agent_sandbox.surfaces.cli.settings import env_settings, resolve

# Written only when set in this process's environment (not from .env or ~/.abx).
PASSTHROUGH_ENV = ("sandbox_base_url", "sandbox_region")


def build_entry(t: Target, scope: str) -> dict[str, Any]:
    cmd = launch_command()
    entry: dict[str, Any] = {**t.extra, "command": cmd[0], "args": [*cmd[1:], "mcp", "start"]}
    env: dict[str, str] = {}
    if scope in t.key_scopes:
        key = resolve("sandbox_api_key").value
        if key:
            env["ABX_SANDBOX_API_KEY"] = key
    for name, value in env_settings().to_env().items():
        if value and name in {env_name(f) for f in PASSTHROUGH_ENV}:
            env[name] = value
    if env:
        entry["env"] = env
    return entry


def install(name: str, scope: str | None) -> dict[str, Any]:
    t = target(name)
    scope = scope or t.default_scope
    path = t.path(scope)
    entry = build_entry(t, scope)
    outcome = merge_write(path, t.fmt, t.servers_key, SERVER_NAME, entry)
    return {"target": t.name, "scope": scope, "path": str(path), "changed": outcome.changed,
            "backup": str(outcome.backup) if outcome.backup else None,
            "command": [entry["command"], *entry["args"]],
            "env": sorted(entry.get("env", {})), "next": t.next_steps(scope)}


def uninstall(name: str, scope: str | None) -> dict[str, Any]:
    t = target(name)
    scope = scope or t.default_scope
    path = t.path(scope)
    outcome = merge_write(path, t.fmt, t.servers_key, SERVER_NAME, None)
    return {"target": t.name, "scope": scope, "path": str(path), "removed": outcome.changed,
            "backup": str(outcome.backup) if outcome.backup else None}


def installed(t: Target) -> bool:
    return any(read_entry(t.path(s), t.fmt, t.servers_key, SERVER_NAME) is not None
               for s in t.scopes)


def installed_flags() -> dict[str, bool]:
    return {f"installed_{name.replace('-', '_')}": installed(t) for name, t in TARGETS.items()}
