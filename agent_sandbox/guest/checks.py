"""Checks of a request's arguments: a bad one becomes an ``invalid_argument`` error
naming the field (stdlib only)."""

from __future__ import annotations

import os
import re

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"  # runtime.validate's, kept equal by a test

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of startup; annotations are strings anyway
    from typing import Any, Dict, List, Optional

    Req = Dict[str, Any]

if __package__:
    from .errors import bad
    from .limits import DEFAULT_ENV_DROP, MAX_TIMEOUT
else:  # imported by agent.py from the guest's directory
    from errors import bad  # type: ignore[no-redef]
    from limits import DEFAULT_ENV_DROP, MAX_TIMEOUT  # type: ignore[no-redef]


def path(req: Req, key: str = "path") -> str:
    value = req.get(key)
    if not isinstance(value, str) or not value:
        raise bad(f"'{key}' must be a non-empty string")
    if "\0" in value:
        raise bad(f"'{key}' contains a NUL byte")
    if not value.startswith("/"):
        raise bad(f"'{key}' must be an absolute path, got {value!r}")
    return value


def integer(req: Req, key: str, default: Optional[int], lo: int, hi: int) -> Optional[int]:
    value = req.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad(f"'{key}' must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def timeout(req: Req) -> Optional[float]:
    """Seconds, finite and at most MAX_TIMEOUT (JSON brings NaN and Infinity too: a NaN
    deadline never passes, and an endless one overflows a lock's or poll's wait)."""
    value = req.get("timeout")
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 < value <= MAX_TIMEOUT):  # False for NaN
        raise bad(f"'timeout' must be a number of seconds in (0, {MAX_TIMEOUT:g}] or null, "
                  f"got {value!r}")
    return float(value)


def pid(req: Req) -> int:
    if req.get("pid") is None:
        raise bad("'pid' is required")
    return int(integer(req, "pid", None, 1, 1 << 22) or 0)


def str_list(value: Any, key: str) -> List[str]:
    if not isinstance(value, list) or not value:
        raise bad(f"'{key}' must be a non-empty list of strings")
    for item in value:
        if not isinstance(item, str) or "\0" in item:
            raise bad(f"'{key}' items must be strings without NUL bytes")
    return value


def env(value: Any) -> Dict[str, str]:
    if value is None:  # default: the agent's own environment minus its secrets
        return {k: v for k, v in os.environ.items() if k not in DEFAULT_ENV_DROP}
    if not isinstance(value, dict):
        raise bad("'env' must be an object of string values")
    for key, val in value.items():
        if not re.fullmatch(ENV_NAME_PATTERN, key) or not isinstance(val, str) or "\0" in val:
            raise bad(f"invalid environment variable {key!r}")
    return value
