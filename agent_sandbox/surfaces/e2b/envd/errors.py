"""Our errors as envd's: Connect codes for its RPC services (which E2B's SDKs map to their
exceptions: NOT_FOUND to ``FileNotFoundException``/``NotFoundException``...), ``{code,
message}`` JSON with the HTTP status for its plain HTTP routes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio.to_thread
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from starlette.responses import JSONResponse

from agent_sandbox.core.errors import LockedError, SandboxError
from agent_sandbox.surfaces.http.errors import log

T = TypeVar("T")
_CODES = {"not_found": Code.NOT_FOUND, "invalid_argument": Code.INVALID_ARGUMENT,
          "wrong_state": Code.FAILED_PRECONDITION, "timeout": Code.DEADLINE_EXCEEDED,
          "resource_exhausted": Code.RESOURCE_EXHAUSTED,
          "runtime_unavailable": Code.UNAVAILABLE,
          "permission_denied": Code.PERMISSION_DENIED,
          "unauthenticated": Code.UNAUTHENTICATED, "cancelled": Code.CANCELED,
          # A file another task writes or holds (retry later), a write's version gone.
          "locked": Code.ABORTED, "conflict": Code.FAILED_PRECONDITION}


def connect_error(exc: SandboxError) -> ConnectError:
    return ConnectError(_CODES.get(exc.code, Code.INTERNAL), exc.message)


def unexpected(exc: Exception, what: str) -> ConnectError:
    """A bug of ours: logged here, and no traceback or internals for the client."""
    log.error("e2b envd %s failed", what, exc_info=exc)
    return ConnectError(Code.INTERNAL, f"internal error in {what}: {type(exc).__name__} "
                                       "(the gateway's log has the details)")


async def blocking(fn: Callable[[], T], what: str) -> T:
    """``fn`` (a blocking provider call) in a worker thread, its errors as Connect's."""
    try:
        return await anyio.to_thread.run_sync(fn)
    except SandboxError as exc:
        raise connect_error(exc) from None
    except ConnectError:
        raise
    except Exception as exc:  # noqa: BLE001 - becomes INTERNAL, not a traceback
        raise unexpected(exc, what) from None


def http_error(status: int, message: str,
               headers: dict[str, str] | None = None) -> JSONResponse:
    """envd's error body: ``{"code": <HTTP status>, "message": ...}``."""
    return JSONResponse({"code": status, "message": message}, status_code=status,
                        headers=headers)


def http_sandbox_error(exc: SandboxError) -> JSONResponse:
    status = exc.http_status
    if exc.code == "resource_exhausted" and "space" in exc.message.lower():
        status = 507  # envd's "not enough disk space" (the SDK's NotEnoughSpaceException)
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, LockedError) else None
    return http_error(status, exc.message, headers)
