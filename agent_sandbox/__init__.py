"""agent-sandbox: self-hosted, secure sandboxes for AI agents.

Distributed as ``abx-sandbox`` (import name ``agent_sandbox``, command ``abx``). The SDK
classes are imported on first use, so that ``import agent_sandbox.<module>`` (the ``abx``
launcher, the MCP server) does not pay for the SDK and its models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_sandbox.sdk import AsyncSandbox, AsyncSecret, AsyncVolume, Sandbox, Secret, Volume

# The one definition of the version: pyproject.toml reads it (setuptools dynamic version).
__version__ = "0.1.0"
DISTRIBUTION = "abx-sandbox"
__all__ = ["DISTRIBUTION", "AsyncSandbox", "AsyncSecret", "AsyncVolume", "Sandbox", "Secret",
           "Volume", "__version__"]
_SDK = ("AsyncSandbox", "AsyncSecret", "AsyncVolume", "Sandbox", "Secret", "Volume")


def __getattr__(name: str) -> Any:
    if name in _SDK:
        from agent_sandbox import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'agent_sandbox' has no attribute {name!r}")
