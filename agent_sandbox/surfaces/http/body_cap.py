"""A cap on the request bodies the gateway's API reads whole (JSON: a create, a command,
a cell), counted as they arrive: FastAPI reads a body before its dependencies run, so
without it anyone, with no key, could make the gateway hold any size. The routes that
stream a body into the sandbox (a file, an archive, a port's HTTP) never hold it and are
not capped; E2B's API bounds its own (surfaces/e2b)."""

from __future__ import annotations

import re
from typing import Any

from starlette.exceptions import HTTPException

MAX_BODY = 16 << 20  # bytes
_STREAMED = re.compile(r"^/v1/sandboxes/[^/]+/(files/(content|archive)|ports/\d+(/.*)?)$"
                       r"|^/s/shr-[0-9a-f]+/")  # a port's share link (routes/previews.py)


class BodyCap:
    def __init__(self, app: Any, limit: int = MAX_BODY) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or _STREAMED.match(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        limit = self.limit
        declared = dict(scope.get("headers", ())).get(b"content-length", b"")
        read = 0

        def too_large() -> HTTPException:
            # Raised in the route's body read: the app's handler answers it (our JSON).
            return HTTPException(413, f"the request body is over {limit >> 20} MiB; "
                                      "files go through PUT .../files/content (streamed)")

        async def capped() -> dict[str, Any]:
            nonlocal read
            if declared.isdigit() and int(declared) > limit:
                raise too_large()
            message = await receive()
            read += len(message.get("body", b""))
            if read > limit:
                raise too_large()
            return message

        await self.app(scope, capped, send)
