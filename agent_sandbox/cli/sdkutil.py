"""Reaching sandboxes from the CLI: the provider the resolved settings select."""

from __future__ import annotations

from typing import Any

from agent_sandbox.cli.output import UsageError
from agent_sandbox.cli.settings import cli_settings

# A person waits at the terminal: a gateway that is down fails in seconds, not after the
# SDK's 30 s of retries (ABX_SANDBOX_RETRY_SECONDS, when set, still wins).
CLI_RETRY_SECONDS = 2.0


def settings_for_sdk() -> Any:
    settings = cli_settings()
    if "sandbox_retry_seconds" in settings.model_fields_set:
        return settings
    return settings.model_copy(update={"sandbox_retry_seconds": CLI_RETRY_SECONDS})


def provider() -> Any:
    """A remote gateway when ``base_url`` resolves (env > ./.env > ~/.abx), else this host."""
    from agent_sandbox.providers import default_provider

    return default_provider(settings_for_sdk())


def template_engine(action: str) -> Any:
    """The engine `abx sandbox create` uses, for building or removing templates: only an
    engine in this process can import a directory; for a daemon or a gateway, say who can."""
    from agent_sandbox.providers.select import current_engine

    settings = settings_for_sdk()
    choice = current_engine(settings)
    if choice.kind == "daemon" or (choice.target or "").startswith("unix://"):
        raise UsageError(
            f"`abx template {action}` cannot go through the abx daemon ({choice.target}) "
            "your sandboxes run on: its templates live in root's engine. Ask an "
            f"administrator to run `sudo abx template {action} ...` on this host (the "
            "daemon shares root's data dir unless installed with --data-dir; then with "
            "ABX_DATA_DIR set to it)")
    if choice.kind == "remote":
        raise UsageError(
            f"`abx template {action}` works on the engine of the gateway's host, not "
            f"through the gateway at {choice.target}: run it there (`abx template list` "
            "works from here)")
    return provider()


def default_template() -> str:
    return cli_settings().default_template


def parse_pairs(items: list[str] | None, what: str) -> dict[str, str] | None:
    if not items:
        return None
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"{what} must look like NAME=VALUE, got {item!r}")
        out[name] = value
    return out
