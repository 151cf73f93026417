"""Wire errors: the one JSON shape ``{code, message, details}`` both ways."""

from __future__ import annotations

import json
from typing import Any

from agent_sandbox.core.errors import SandboxError, UnauthenticatedError, error_from_code

__all__ = ["UnauthenticatedError", "decode_error"]


def decode_error(status: int, body: bytes, retry_after: str | None = None) -> SandboxError:
    """The exception a gateway error response stands for."""
    try:
        payload: Any = json.loads(body or b"{}")
    except ValueError:
        payload = None
    if not isinstance(payload, dict) or "code" not in payload:
        text = body[:500].decode("utf-8", "replace").strip()
        return SandboxError(f"gateway answered HTTP {status}: {text or '(empty)'}",
                            details={"http_status": status})
    code = str(payload["code"])
    message = str(payload.get("message", ""))
    details = payload.get("details") if isinstance(payload.get("details"), dict) else {}
    if retry_after is not None and "retry_after" not in details:
        details = {**details, "retry_after": retry_after}
    return error_from_code(code, message, details)
