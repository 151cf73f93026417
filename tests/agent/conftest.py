"""The MCP servers' default template is code-interpreter-v1: build it once, up front, in the
session's data dir (the servers the tests spawn share it), so no tool call waits for it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _code_template() -> None:
    from agent_sandbox.providers.local import local_provider
    from agent_sandbox.runtime import code_template

    code_template.ensure(local_provider().templates)
