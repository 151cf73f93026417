"""Picks the provider for this process (the rules are in ``engine_choice``).

- ``remote``: a gateway at ``ABX_SANDBOX_BASE_URL`` (with ``ABX_SANDBOX_API_KEY``);
- ``daemon``: the shared abx daemon on its unix socket (``ABX_DAEMON_SOCKET``);
- ``embedded`` (root) / ``rootless`` (an ordinary user): the engine in this process;
- ``kubernetes``: Pods of a cluster (``backends/kubernetes``), only when forced.

The settings are the caller's, else those an entry point installed with ``use_settings``,
else the environment read again on every call (cheap), so a process may switch. The
automatic choice is probed once per distinct set of those settings and then kept: a
process whose sandboxes live in the daemon must not quietly fall over to its own engine
when the daemon restarts. One client is kept per (url, key, retry) to reuse its
connections. ``current_engine()`` says what was chosen and why (``abx doctor`` shows it).
"""

from __future__ import annotations

import os
import threading

from agent_sandbox.config.settings import Settings, SettingsError, from_environment
from agent_sandbox.core.errors import RuntimeUnavailableError
from agent_sandbox.core.provider import Provider
from agent_sandbox.providers.choice import EngineChoice, choose_engine

_remotes: dict[tuple[str, str, float], Provider] = {}
_choices: dict[tuple[object, ...], EngineChoice] = {}
_guard = threading.Lock()
_installed: Settings | None = None


def use_settings(settings: Settings | None) -> None:
    """The settings of this process's entry point, for callers that pass none (the SDK's
    ``Sandbox.create()`` inside the MCP server, say). None: read the environment again."""
    global _installed
    _installed = settings


def _settings(given: Settings | None) -> Settings:
    return given or _installed or from_environment()


def _choice_key(s: Settings) -> tuple[object, ...]:
    return (os.geteuid(), s.engine, s.sandbox_base_url, s.daemon_socket)


def current_engine(settings: Settings | None = None) -> EngineChoice:
    """The engine ``default_provider()`` uses with these settings (chosen once, then kept);
    a failed choice is not kept, so fixing the cause takes effect on the next call."""
    try:
        settings = _settings(settings)
    except SettingsError:
        return choose_engine(None)  # the bad setting, as a choice that says so
    key = _choice_key(settings)
    with _guard:
        choice = _choices.get(key)
    if choice is not None:
        return choice
    choice = choose_engine(settings)
    if choice.kind is not None:
        with _guard:
            choice = _choices.setdefault(key, choice)
    return choice


def _remote(base_url: str, key: str, retry_seconds: float) -> Provider:
    with _guard:
        provider = _remotes.get((base_url, key, retry_seconds))
        if provider is None:
            from agent_sandbox.remote import RemoteProvider

            provider = _remotes[(base_url, key, retry_seconds)] = RemoteProvider(
                base_url, key or None, retry_seconds=retry_seconds)
        return provider


def default_provider(settings: Settings | None = None) -> Provider:
    try:
        settings = _settings(settings)
    except SettingsError as exc:  # e.g. ABX_ENGINE=kvm: no engine can be chosen
        raise RuntimeUnavailableError(exc.message) from None
    choice = current_engine(settings)
    if choice.kind is None:
        raise RuntimeUnavailableError(choice.error or "no sandbox engine is usable",
                                      details={"engine": choice.to_dict()})
    retry = settings.sandbox_retry_seconds
    if choice.kind == "remote":
        return _remote(choice.target or "", settings.sandbox_api_key, retry)
    if choice.kind == "daemon":
        return _remote("unix://" + (choice.target or ""), "", retry)
    if choice.kind == "kubernetes":
        from agent_sandbox.providers.kubernetes import kubernetes_provider

        return kubernetes_provider(settings)
    if choice.kind == "memory":
        from agent_sandbox.providers.memory import memory_provider

        return memory_provider(settings)
    from agent_sandbox.providers.local import local_provider

    return local_provider(settings)
