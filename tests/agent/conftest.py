"""The MCP servers' default template is code-interpreter-v1: build it once, up front, in the
session's data dir (the servers the tests spawn share it), so no tool call waits for it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _code_template(code_template: str) -> None:
    """Built by the shared session fixture."""
