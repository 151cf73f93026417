"""Picks the provider for this process."""

from __future__ import annotations

from agent_sandbox.providers.base import Provider


def default_provider() -> Provider:
    from agent_sandbox.providers.local import local_provider

    return local_provider()
