"""Input checks shared by every engine entry point: bad input fails loudly, early."""

from __future__ import annotations

import re
from typing import Any

from agent_sandbox.core import code_languages
from agent_sandbox.core.bounds import MAX_LOCK_TOKEN, MAX_LOCK_TTL, MAX_LOCK_WAIT, MAX_VERSION
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.file_metadata import check as file_metadata  # noqa: F401 - one place
from agent_sandbox.core.models import CodeContext

# The one environment-variable-name rule (engine, templates, images, MCP tools, gateway
# schema). The stdlib-only guest keeps an equal copy: tests/agent/test_env_name.py checks.
# Spelled for JSON Schema, where $ is the very end; in Python check with is_env_name, whose
# fullmatch keeps a trailing newline out too.
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_ENV_NAME = re.compile(ENV_NAME_PATTERN)
# An account inside a sandbox (``commands.run(user=...)``); the guest keeps an equal copy.
USER_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"
_USER_NAME = re.compile(USER_NAME_PATTERN)
# Spelled for JSON Schema; checked with fullmatch (no final newline either).
SANDBOX_ID_PATTERN = r"^sbx-[a-z0-9]{10}$"
CODE_CONTEXT_PATTERN = r"^[a-z0-9][a-z0-9-]{0,31}$"
_SANDBOX_ID = re.compile(SANDBOX_ID_PATTERN)
SNAPSHOT_ID_PATTERN = r"^snap-[a-z0-9]{10}$"
_SNAPSHOT_ID = re.compile(SNAPSHOT_ID_PATTERN)
SNAPSHOT_NAME_PATTERN = r"^[^\x00-\x1f\x7f]{0,64}$"
_SNAPSHOT_NAME = re.compile(SNAPSHOT_NAME_PATTERN)
_CODE_CONTEXT = re.compile(CODE_CONTEXT_PATTERN)
DEFAULT_CONTEXT = code_languages.DEFAULT_CONTEXT


def sandbox_id(value: Any) -> str:
    if not isinstance(value, str) or not _SANDBOX_ID.fullmatch(value):
        raise InvalidArgumentError(
            f"invalid sandbox id {value!r}: ids look like 'sbx-' followed by 10 lowercase "
            "letters or digits"
        )
    return value


def snapshot_id(value: Any) -> str:
    if not isinstance(value, str) or not _SNAPSHOT_ID.fullmatch(value):
        raise InvalidArgumentError(
            f"invalid snapshot id {value!r}: ids look like 'snap-' followed by 10 lowercase "
            "letters or digits (list them with list_snapshots)")
    return value


def snapshot_name(value: Any) -> str:
    """A snapshot's label: any text up to 64 characters, no control characters."""
    if value is None:
        return ""
    if not isinstance(value, str) or not _SNAPSHOT_NAME.fullmatch(value):
        raise InvalidArgumentError(f"a snapshot name is text of at most 64 characters "
                                   f"without control characters, got {value!r}")
    return value


def code_context(value: Any) -> str:
    """A code context id (or a ``CodeContext``); None is the ``default`` context."""
    if isinstance(value, CodeContext):
        value = value.id
    if value is None:
        return DEFAULT_CONTEXT
    if not isinstance(value, str) or not _CODE_CONTEXT.fullmatch(value):
        raise InvalidArgumentError(f"invalid code context id {value!r}")
    return value


code_language = code_languages.code_language


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
             integer: bool = False, why: str = "") -> Any:
    """``value`` in (0, maximum]; ``why`` says what the maximum is, when it is not obvious."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{what} must be a number, got {value!r}")
    if integer and not float(value).is_integer():
        raise InvalidArgumentError(f"{what} must be a whole number, got {value!r}")
    if not value > 0:
        raise InvalidArgumentError(f"{what} must be greater than 0, got {value!r}")
    if maximum is not None and value > maximum:
        bound = f"{maximum} ({why})" if why else f"{maximum}"
        raise InvalidArgumentError(f"{what} must be at most {bound}, got {value!r}")
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


def lock_wait(value: Any) -> float | None:
    """Seconds a write or lock waits for the file's turn (None: the default, 3 s)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 0 <= value <= MAX_LOCK_WAIT:  # False for NaN
        raise InvalidArgumentError(f"lock_wait must be a number of seconds from 0 to "
                                   f"{MAX_LOCK_WAIT:g}, got {value!r}")
    return float(value)


def lock_ttl(value: Any) -> float:
    return float(positive(value, "ttl", allow_none=False, maximum=MAX_LOCK_TTL,
                          why="an hour: renew a longer edit's lock"))


# What _opaque takes, for schemas: printable ASCII but the double quote (an ETag's own).
OPAQUE_PATTERN = r"^[ !#-~]+$"


def _opaque(value: Any, what: str, longest: int, gave: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= longest \
            or not value.isascii() or not value.isprintable() or '"' in value:
        raise InvalidArgumentError(f"{what} must be the {gave}, got {str(value)[:80]!r}")
    return value


def version(value: Any) -> str | None:
    """A file version for ``if_match`` (None: write whatever the file is now)."""
    return _opaque(value, "if_match", MAX_VERSION, "version a read or a listing gave")


def lock_token(value: Any) -> str | None:
    return _opaque(value, "lock_token", MAX_LOCK_TOKEN, "token lock_file gave")


def port(value: Any) -> int:
    """A TCP port inside a sandbox."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
        raise InvalidArgumentError(f"port {value!r} is not a TCP port: give an integer from "
                                   "1 to 65535 (where the server listens inside the sandbox)")
    return value


def unicode_text(value: Any, where: str = "body") -> None:
    """JSON can escape lone surrogates (``"\\ud800"``), which are not Unicode text: no
    command, path, name or stdin can carry one."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgumentError(f"{where}: not valid Unicode text (a lone "
                                       "surrogate)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            unicode_text(key, where)
            unicode_text(item, f"{where}.{key}" if isinstance(key, str) else where)
    elif isinstance(value, list | tuple):
        for item in value:
            unicode_text(item, where)
