"""``Secret``: credentials sandboxes use but never see (docs/secrets.md).

A secret is stored on the engine's host (or the gateway's, per API key) with a rule: the
hosts it may be sent to and how. ``Sandbox.create(secrets=["gh"], network=...)`` gives the
sandbox a placeholder (``GH_TOKEN=abx-secret:gh``), which its network proxy swaps for the
value on HTTPS requests to those hosts. The value is never returned.
"""

from __future__ import annotations

from pathlib import Path

from agent_sandbox.core.secrets import SecretInfo, SecretRule
from agent_sandbox.providers import Provider, default_provider


class Secret:
    """Secrets, by name; the methods are classmethods."""

    def __init__(self) -> None:
        raise TypeError("Secret has only classmethods: Secret.create(...), Secret.list(), "
                        "Secret.delete(name)")

    @classmethod
    def create(cls, name: str, *, hosts: list[str] | str, value: str | None = None,
               value_file: str | Path | None = None, header: str | None = "Authorization",
               format: str | None = None, basic: bool = False, query: str | None = None,
               env: str = "", inject: bool = False, replace: bool = False,
               provider: Provider | None = None) -> SecretInfo:
        """Store a secret: ``value`` (or the first line of ``value_file``) may go to
        ``hosts`` (``host`` or ``host:port``; 443 by default) as ``header`` (formatted by
        ``format``, ``{}`` the value: ``"Bearer {}"`` for Authorization), as basic auth
        (``basic``: the value is ``user:password``) or as the query parameter ``query``.
        ``env`` names the variable holding the placeholder (default ``NAME_TOKEN``);
        ``inject`` sets the header on every request to ``hosts``, placeholder or not (what
        E2B's ``network.rules`` transforms need)."""
        if (value is None) == (value_file is None):
            raise TypeError("give the value or value_file (not both)")
        if value_file is not None:
            value = Path(value_file).read_text().rstrip("\r\n")
        assert value is not None
        rule = SecretRule(name=name, hosts=hosts, header=header, format=format, basic=basic,
                          query=query, env=env, inject=inject)
        return (provider or default_provider()).create_secret(rule, value, replace=replace)

    @classmethod
    def list(cls, provider: Provider | None = None) -> list[SecretInfo]:
        """Your secrets' rules (never their values)."""
        return (provider or default_provider()).list_secrets()

    @classmethod
    def delete(cls, name: str, provider: Provider | None = None) -> None:
        """Delete a secret; sandboxes made with it keep it until they end."""
        (provider or default_provider()).delete_secret(name)
