"""envd's ``GET/POST /files`` (stub: filled in by the filesystem work)."""

from __future__ import annotations

from starlette.routing import Route

routes: list[Route] = []
