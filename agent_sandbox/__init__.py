"""agent-sandbox: self-hosted, secure sandboxes for AI agents."""

from agent_sandbox.sdk import AsyncSandbox, Sandbox

__all__ = ["AsyncSandbox", "Sandbox"]
__version__ = "0.1.0"
