"""One error hierarchy for every layer.

Each class carries a stable ``code`` string; the MCP server and the REST gateway put that
code on the wire, and the remote provider maps it back to the same class, so code written
against the embedded engine behaves the same remotely.
"""

from __future__ import annotations

from typing import Any


class SandboxError(Exception):
    """Base of every error agent_sandbox raises on purpose."""

    code = "internal"
    http_status = 500

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class NotFoundError(SandboxError):
    """A sandbox, template, process, file or volume that does not exist."""

    code = "not_found"
    http_status = 404


class InvalidArgumentError(SandboxError):
    """Malformed or hostile input: bad path, negative limit, unknown option."""

    code = "invalid_argument"
    http_status = 400


class WrongStateError(SandboxError):
    """The object exists but cannot do that now (e.g. exec in a killed sandbox)."""

    code = "wrong_state"
    http_status = 409


class SandboxTimeoutError(SandboxError, TimeoutError):
    """An operation ran past its deadline."""

    code = "timeout"
    http_status = 504


class ResourceExhaustedError(SandboxError):
    """A limit or quota was hit: disk, sandboxes, concurrent calls."""

    code = "resource_exhausted"
    http_status = 429


class RuntimeUnavailableError(SandboxError):
    """The host cannot run sandboxes: runc missing, no root, kernel feature absent."""

    code = "runtime_unavailable"
    http_status = 503


class PermissionDeniedError(SandboxError):
    """The caller may not do this: use the service at all (the daemon refused this local
    user), or ask for a network policy beyond an operator's ceiling."""

    code = "permission_denied"
    http_status = 403


class UnauthenticatedError(SandboxError):
    """No API key, or an unknown or revoked one (the gateway answers 401)."""

    code = "unauthenticated"
    http_status = 401


class CancelledCallError(SandboxError):
    """The caller cancelled the call; what it started was stopped."""

    code = "cancelled"
    http_status = 499  # nginx's "client closed request": nobody is left to read it


class LockedError(SandboxError):
    """Another task is writing the file, or holds its lock: retry after ``retry_after``
    seconds (in ``details``, with the ``path`` and, for a lock, its ``holder`` and
    ``expires_in``). The REST API answers 423 with a ``Retry-After`` header."""

    code = "locked"
    http_status = 423

    @property
    def retry_after(self) -> int:
        """Seconds to wait before retrying: 1 to 60, whatever the details say (they come
        from the sandbox's guest)."""
        value = self.details.get("retry_after")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            return 1
        return int(max(1, min(60, value)))


class ConflictError(SandboxError):
    """A conditional write (``if_match``) found the file at another version, or the lock
    its token named is gone; ``details`` has the ``path`` and the ``current_version``
    (None: the file does not exist). Read the file again and redo the change."""

    code = "conflict"
    http_status = 412


_BY_CODE: dict[str, type[SandboxError]] = {
    cls.code: cls
    for cls in (
        SandboxError,
        NotFoundError,
        InvalidArgumentError,
        WrongStateError,
        SandboxTimeoutError,
        ResourceExhaustedError,
        RuntimeUnavailableError,
        PermissionDeniedError,
        UnauthenticatedError,
        CancelledCallError,
        LockedError,
        ConflictError,
    )
}


def error_from_code(code: str, message: str, details: dict[str, Any] | None = None) -> SandboxError:
    """Rebuild the exception class a wire error code stands for."""
    return _BY_CODE.get(code, SandboxError)(message, details=details)
