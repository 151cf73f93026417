"""Reaching sandboxes from the CLI: the provider the resolved settings select."""

from __future__ import annotations

from typing import Any

from agent_sandbox.cli.output import UsageError
from agent_sandbox.cli.settings import cli_settings


def provider() -> Any:
    """A remote gateway when ``base_url`` resolves (env > ./.env > ~/.abx), else this host."""
    from agent_sandbox.providers import default_provider

    return default_provider(cli_settings())


def local_engine() -> Any:
    if cli_settings().sandbox_base_url:
        raise UsageError("template commands manage this host's engine, but base_url is set "
                         "(a remote gateway); unset ABX_SANDBOX_BASE_URL / `abx config unset "
                         "base_url` to use them here")
    from agent_sandbox.providers.local import local_provider

    return local_provider(cli_settings())


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
