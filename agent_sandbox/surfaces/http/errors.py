"""Every failure leaves the gateway as ``{code, message, details}`` with its HTTP status."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent_sandbox.core.errors import LockedError, SandboxError

log = logging.getLogger("agent_sandbox.surfaces.http")

_HTTP_CODES = {400: "invalid_argument", 401: "unauthenticated", 404: "not_found",
               405: "invalid_argument", 409: "wrong_state", 413: "invalid_argument",
               412: "conflict", 415: "invalid_argument", 422: "invalid_argument",
               423: "locked", 429: "resource_exhausted"}


def error_response(status: int, code: str, message: str,
                   details: dict[str, Any] | None = None) -> JSONResponse:
    headers = {}
    if status in (423, 429):  # 423: a file locked by another task (LockedError)
        headers["Retry-After"] = str(_seconds((details or {}).get("retry_after")))
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="agent-sandbox"'
    return JSONResponse({"code": code, "message": message, "details": details or {}},
                        status_code=status, headers=headers)


def _seconds(value: Any) -> int:
    """Whole seconds for Retry-After, 1 to 3600: details may come from a sandbox's guest
    (a text there would be a header of its choosing, or a failed response)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return 1
    return int(max(1, min(3600, value)))


def sandbox_error_response(exc: SandboxError) -> JSONResponse:
    details = exc.details
    if isinstance(exc, LockedError):  # the guest's hint, held to 1..60 s
        details = {**details, "retry_after": exc.retry_after}
    return error_response(exc.http_status, exc.code, exc.message, details)


def _describe(errors: list[dict[str, Any]]) -> str:
    """pydantic's errors as one sentence: where, and what was wrong."""
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "request"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def install(app: FastAPI) -> None:
    @app.exception_handler(SandboxError)
    async def _sandbox(_: Request, exc: SandboxError) -> JSONResponse:
        return sandbox_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")}
                  for e in exc.errors()]
        return error_response(400, "invalid_argument", _describe(errors),
                              {"errors": _jsonable(errors)})

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "internal")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return error_response(500, "internal", f"internal error: {type(exc).__name__}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)
