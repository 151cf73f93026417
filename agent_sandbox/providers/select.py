"""Picks the provider for this process (the rules are in ``engine_choice``).

- ``remote``: a gateway at ``ABX_SANDBOX_BASE_URL`` (with ``ABX_SANDBOX_API_KEY``);
- ``daemon``: the shared abx daemon on its unix socket (``ABX_DAEMON_SOCKET``);
- ``embedded`` (root) / ``rootless`` (an ordinary user): the engine in this process.

The environment is read on every call (cheap), so a process may switch. The automatic
choice is probed once per distinct environment and then kept: a process whose sandboxes
live in the daemon must not quietly fall over to its own engine when the daemon restarts.
One client is kept per (url, key) to reuse its connections. ``current_engine()`` says what
was chosen and why (``abx doctor`` shows it).
"""

from __future__ import annotations

import os
import threading

from agent_sandbox.errors import RuntimeUnavailableError
from agent_sandbox.providers.base import Provider
from agent_sandbox.providers.engine_choice import EngineChoice, choose_engine

_remotes: dict[tuple[str, str], Provider] = {}
_choices: dict[tuple[object, ...], EngineChoice] = {}
_guard = threading.Lock()

_ENV = ("ABX_ENGINE", "ABX_SANDBOX_BASE_URL", "ABX_DAEMON_SOCKET")


def _env_key() -> tuple[object, ...]:
    return (os.geteuid(), *(os.environ.get(name, "").strip() for name in _ENV))


def current_engine() -> EngineChoice:
    """The engine ``default_provider()`` uses in this environment (chosen once, then kept);
    a failed choice is not kept, so fixing the cause takes effect on the next call."""
    key = _env_key()
    with _guard:
        choice = _choices.get(key)
    if choice is not None:
        return choice
    choice = choose_engine()
    if choice.kind is not None:
        with _guard:
            choice = _choices.setdefault(key, choice)
    return choice


def _remote(base_url: str, key: str) -> Provider:
    with _guard:
        provider = _remotes.get((base_url, key))
        if provider is None:
            from agent_sandbox.providers.remote import RemoteProvider

            provider = _remotes[(base_url, key)] = RemoteProvider(base_url, key or None)
        return provider


def default_provider() -> Provider:
    choice = current_engine()
    if choice.kind is None:
        raise RuntimeUnavailableError(choice.error or "no sandbox engine is usable",
                                      details={"engine": choice.to_dict()})
    if choice.kind == "remote":
        return _remote(choice.target or "", os.environ.get("ABX_SANDBOX_API_KEY", ""))
    if choice.kind == "daemon":
        return _remote("unix://" + (choice.target or ""), "")
    from agent_sandbox.providers.local import local_provider

    return local_provider()
