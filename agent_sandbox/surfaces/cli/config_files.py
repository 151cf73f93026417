"""The two files ``abx`` reads settings from besides the environment: ``./.env`` and
``~/.abx/config``. Standard library only: the ``abx mcp start`` launcher reads them before
(instead of) importing the CLI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class ConfigFileError(ValueError):
    """``~/.abx/config`` exists but is not a JSON object (the message says how to fix it)."""


def abx_home() -> Path:
    return Path(os.path.expanduser("~")) / ".abx"


def config_path() -> Path:
    return abx_home() / "config"


def parse_config(text: str, path: Path) -> dict[str, str]:
    """The keys of ``~/.abx/config`` (a JSON object; an empty file is an empty one)."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigFileError(f"{path} is not valid JSON ({exc}); fix it or delete it and run "
                              "`abx config set` again") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path} must hold a JSON object; fix it or delete it")
    return {str(k): str(v) for k, v in data.items() if v is not None}


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
