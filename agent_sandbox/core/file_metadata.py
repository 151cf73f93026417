"""A file's user-defined metadata, as E2B's envd keeps it: extended attributes named
``user.e2b.<key>`` on the file, given with a write (``X-Metadata-<key>`` headers on E2B's
API) and read back with its entry. Checked once here for every surface and for what a
guest reports (a sandbox can set any xattr itself)."""

from __future__ import annotations

import re
from typing import Any

from agent_sandbox.core.bounds import MAX_FILE_METADATA
from agent_sandbox.core.errors import InvalidArgumentError

FILE_METADATA_PREFIX = "user.e2b."  # the xattrs a file's metadata is kept in (envd's)
# A key travels as an HTTP header's name (X-Metadata-<key>): a header token, lowercased.
_METADATA_KEY = re.compile(r"[a-z0-9!#$%&'*+\-.^_`|~]+")
_METADATA_VALUE = re.compile(r"[ -~]*")


def check(value: Any) -> dict[str, str] | None:
    """A file's metadata as E2B's envd takes it: keys are HTTP header tokens (lowercased),
    values printable ASCII, all of them (with the xattr prefix) within
    ``MAX_FILE_METADATA`` bytes. None or empty: none (a write then clears the file's)."""
    if not value:
        return None
    if not isinstance(value, dict):
        raise InvalidArgumentError("metadata must be a mapping of strings to strings")
    out: dict[str, str] = {}
    for key, val in value.items():
        name = key.lower() if isinstance(key, str) else key
        if not isinstance(name, str) or not _METADATA_KEY.fullmatch(name):
            raise InvalidArgumentError(
                f"metadata key {str(key)[:64]!r} must be letters, digits or !#$%&'*+-.^_`|~ "
                "(an HTTP header name)")
        if not isinstance(val, str) or not _METADATA_VALUE.fullmatch(val):
            raise InvalidArgumentError(f"metadata value of {name!r} must be printable ASCII")
        out[name] = val
    size = sum(len(FILE_METADATA_PREFIX) + len(k) + len(v) for k, v in out.items())
    if size > MAX_FILE_METADATA:
        raise InvalidArgumentError(f"metadata takes {size} bytes (with the "
                                   f"{FILE_METADATA_PREFIX!r} prefix of each key): at most "
                                   f"{MAX_FILE_METADATA}")
    return out
