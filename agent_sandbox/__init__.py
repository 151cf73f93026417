"""agent-sandbox: self-hosted, secure sandboxes for AI agents."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_sandbox.sdk import AsyncSandbox, Sandbox

__all__ = ["AsyncSandbox", "Sandbox"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy: `import agent_sandbox.x` must not load the SDK and its engine (the STDIO server
    # answers `initialize` before importing them; the CLI starts faster).
    if name in __all__:
        from agent_sandbox import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'agent_sandbox' has no attribute {name!r}")
