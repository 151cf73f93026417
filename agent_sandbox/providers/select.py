"""Picks the provider for this process.

``ABX_SANDBOX_BASE_URL`` set: a remote gateway (with ``ABX_SANDBOX_API_KEY``); otherwise
the embedded engine. The environment is read on every call (cheap), so a process may
switch; one remote client is kept per (url, key) to reuse its connections.
"""

from __future__ import annotations

import os
import threading

from agent_sandbox.providers.base import Provider

_remotes: dict[tuple[str, str], Provider] = {}
_guard = threading.Lock()


def default_provider() -> Provider:
    base_url = os.environ.get("ABX_SANDBOX_BASE_URL", "").strip()
    if base_url:
        key = os.environ.get("ABX_SANDBOX_API_KEY", "")
        with _guard:
            provider = _remotes.get((base_url, key))
            if provider is None:
                from agent_sandbox.providers.remote import RemoteProvider

                provider = _remotes[(base_url, key)] = RemoteProvider(base_url, key or None)
            return provider
    from agent_sandbox.providers.local import local_provider

    return local_provider()
