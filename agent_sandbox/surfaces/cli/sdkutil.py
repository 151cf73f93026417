"""Reaching sandboxes from the CLI: the provider the resolved settings select."""

from __future__ import annotations

from typing import Any

from agent_sandbox.surfaces.cli.output import UsageError
from agent_sandbox.surfaces.cli.settings import cli_settings

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


def connect(sandbox_id: str) -> Any:
    """The sandbox through provider(); an id that cannot be one is a usage error saying
    where ids come from, before any engine is reached."""
    from agent_sandbox import Sandbox
    from agent_sandbox.core import validate
    from agent_sandbox.core.errors import InvalidArgumentError

    try:
        validate.sandbox_id(sandbox_id)
    except InvalidArgumentError as exc:
        raise UsageError(f"{exc.message}; `abx sandbox list` shows yours") from None
    return Sandbox.connect(sandbox_id, provider=provider())


def unauthenticated(message: str) -> str:
    """A gateway's 401 in the words of this CLI: which key was sent (from where) and how
    to set one, not the HTTP header the gateway asks a bare client for."""
    from agent_sandbox.providers.select import current_engine
    from agent_sandbox.surfaces.cli.config_files import config_path
    from agent_sandbox.surfaces.cli.settings import resolve

    gateway = current_engine(settings_for_sdk()).target or "the gateway"
    how = ("set ABX_SANDBOX_API_KEY, or save the key with `abx config set sandbox_api_key "
           "KEY` (the gateway's operator makes keys with `abx keys create`)")
    key = resolve("sandbox_api_key")
    if key.value is None:
        return f"the gateway at {gateway} needs an API key: {how}"
    where = {"env": "ABX_SANDBOX_API_KEY", "dotenv": "ABX_SANDBOX_API_KEY in ./.env",
             "config": f"sandbox_api_key in {config_path()}"}.get(key.source or "", "")
    return f"the gateway at {gateway} refused the API key from {where} ({message}): {how}"


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
