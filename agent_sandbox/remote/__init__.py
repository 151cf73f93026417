"""A sandbox gateway (``abx serve``) as a provider: sandboxes on another host."""

from agent_sandbox.remote.errors import UnauthenticatedError
from agent_sandbox.remote.provider import RemoteProvider

__all__ = ["RemoteProvider", "UnauthenticatedError"]
