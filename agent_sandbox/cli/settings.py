"""``~/.abx/config`` and credential resolution: process environment, then ./.env, then ~/.abx."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from agent_sandbox.cli.atomic import atomic_write
from agent_sandbox.cli.output import CliError, UsageError


@dataclass(frozen=True)
class Key:
    name: str
    env: str
    secret: bool
    help: str


KEYS: dict[str, Key] = {k.name: k for k in (
    Key("sandbox_api_key", "ABX_SANDBOX_API_KEY", True, "API key of a remote sandbox gateway"),
    Key("base_url", "ABX_SANDBOX_BASE_URL", False, "remote gateway URL (unset: this host)"),
    Key("region", "SANDBOX_REGION", False, "region of the remote gateway"),
    Key("default_template", "ABX_DEFAULT_TEMPLATE", False, "template for new sandboxes"),
    Key("mcp_template", "ABX_MCP_TEMPLATE", False, "template of the MCP server's sandboxes"),
    Key("mcp_tools", "ABX_MCP_TOOLS", False, "MCP tool allowlist (names or presets)"),
)}


def abx_home() -> Path:
    return Path(os.path.expanduser("~")) / ".abx"


def config_path() -> Path:
    return abx_home() / "config"


def key_of(name: str) -> Key:
    key = KEYS.get(name)
    if key is None:
        raise UsageError(f"unknown key {name!r}; known keys: {', '.join(KEYS)}")
    return key


def read_config() -> dict[str, str]:
    path = config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path} is not valid JSON ({exc}); fix it or delete it and run "
                       "`abx config set` again") from None
    if not isinstance(data, dict):
        raise CliError(f"{path} must hold a JSON object; fix it or delete it")
    return {str(k): str(v) for k, v in data.items() if v is not None}


def write_config(data: dict[str, str]) -> Path:
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(),
                 mode=0o600, force_mode=True)
    return path


def read_dotenv(path: Path | None = None) -> dict[str, str]:
    """``KEY=VALUE`` lines of ./.env (``export`` prefixes, quotes and ``#`` comments allowed)."""
    path = path or Path.cwd() / ".env"
    values: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return values
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        name = name.strip().removeprefix("export ").strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        values[name] = value
    return values


@dataclass(frozen=True)
class Resolved:
    key: Key
    value: str | None
    source: str | None  # "env", "dotenv", "config" or None


def resolve(name: str) -> Resolved:
    """One setting, from the first place that has a non-empty value."""
    key = key_of(name)
    value = os.environ.get(key.env, "").strip()
    if value:
        return Resolved(key, value, "env")
    value = read_dotenv().get(key.env, "").strip()
    if value:
        return Resolved(key, value, "dotenv")
    with contextlib.suppress(CliError):
        value = read_config().get(name, "").strip()
        if value:
            return Resolved(key, value, "config")
    return Resolved(key, None, None)


def resolved_env(*names: str) -> dict[str, str]:
    """``{ENV_NAME: value}`` for the named settings that resolve to something."""
    out: dict[str, str] = {}
    for name in names or tuple(KEYS):
        r = resolve(name)
        if r.value is not None:
            out[r.key.env] = r.value
    return out
