"""Input checks shared by every engine entry point: bad input fails loudly, early."""

from __future__ import annotations

import re
from typing import Any

from agent_sandbox.errors import InvalidArgumentError
from agent_sandbox.models import CodeContext

# The one environment-variable-name rule (engine, templates, images, MCP tools, gateway
# schema). The stdlib-only guest keeps an equal copy: tests/agent/test_env_name.py checks.
# Spelled for JSON Schema, where $ is the very end; in Python check with is_env_name, whose
# fullmatch keeps a trailing newline out too.
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_ENV_NAME = re.compile(ENV_NAME_PATTERN)
# An account inside a sandbox (``commands.run(user=...)``); the guest keeps an equal copy.
USER_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"
_USER_NAME = re.compile(USER_NAME_PATTERN)
_SANDBOX_ID = re.compile(r"^sbx-[a-z0-9]{10}\Z")
_CODE_CONTEXT = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}\Z")
DEFAULT_CONTEXT = "default"


def sandbox_id(value: Any) -> str:
    if not isinstance(value, str) or not _SANDBOX_ID.match(value):
        raise InvalidArgumentError(
            f"invalid sandbox id {value!r}: ids look like 'sbx-' followed by 10 lowercase "
            "letters or digits (see list_sandboxes)"
        )
    return value


def code_context(value: Any) -> str:
    """A code context id (or a ``CodeContext``); None is the ``default`` context."""
    if isinstance(value, CodeContext):
        value = value.id
    if value is None:
        return DEFAULT_CONTEXT
    if not isinstance(value, str) or not _CODE_CONTEXT.match(value):
        raise InvalidArgumentError(f"invalid code context id {value!r}")
    return value


def path(value: Any, what: str = "path") -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{what} must be a non-empty string, got {value!r}")
    if "\x00" in value:
        raise InvalidArgumentError(f"{what} contains a NUL byte")
    if not value.startswith("/"):
        raise InvalidArgumentError(
            f"{what} {value!r} is relative: give an absolute path such as /workspace/{value}"
        )
    if len(value) > 4096:
        raise InvalidArgumentError(f"{what} is longer than 4096 characters")
    return value


def is_env_name(name: Any) -> bool:
    return isinstance(name, str) and _ENV_NAME.fullmatch(name) is not None


def envs(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"envs must be a mapping of names to strings, got {value!r}")
    for key, val in value.items():
        if not is_env_name(key):
            raise InvalidArgumentError(f"invalid environment variable name {key!r}")
        if not isinstance(val, str) or "\x00" in val:
            raise InvalidArgumentError(f"environment variable {key} must be a string "
                                       "without NUL bytes")
    return dict(value)


def metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidArgumentError("metadata must be a mapping of strings to strings")
    return dict(value)


def positive(value: Any, what: str, *, allow_none: bool = True, maximum: float | None = None,
             integer: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{what} must be a number, got {value!r}")
    if integer and not float(value).is_integer():
        raise InvalidArgumentError(f"{what} must be a whole number, got {value!r}")
    if not value > 0:
        raise InvalidArgumentError(f"{what} must be greater than 0, got {value!r}")
    if maximum is not None and value > maximum:
        raise InvalidArgumentError(f"{what} must be at most {maximum}, got {value!r}")
    return int(value) if integer else value


def command(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError("command must be a non-empty string")
    if "\x00" in value:
        raise InvalidArgumentError("command contains a NUL byte")
    return value


def user(value: Any) -> str | None:
    """An account to run as inside the sandbox (None: root, the default)."""
    if value is None:
        return None
    if not isinstance(value, str) or not _USER_NAME.fullmatch(value):
        raise InvalidArgumentError(f"user must be an account name such as 'user' or 'root' "
                                   f"(letters, digits, '_', '.', '-'; at most 32), got "
                                   f"{value!r}")
    return value
