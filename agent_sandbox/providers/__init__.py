"""How the SDK reaches sandboxes: one ``Provider`` interface, several implementations."""

from agent_sandbox.core.provider import Provider
from agent_sandbox.providers.select import default_provider

__all__ = ["Provider", "default_provider"]
