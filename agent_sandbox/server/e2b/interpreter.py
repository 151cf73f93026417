"""The code interpreter's API (port 49999 of E2B's code-interpreter template), stub."""

from __future__ import annotations

from starlette.applications import Starlette


def application() -> Starlette:
    return Starlette(routes=[])
