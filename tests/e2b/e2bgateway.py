"""The gateway the E2B tests point E2B's SDKs at (not in conftest.py: another directory's
conftest may own that module name)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent_sandbox.server.keys import KeyStore
from agent_sandbox.server.process import GatewayProcess


@dataclass
class E2BGateway:
    proc: GatewayProcess
    store: KeyStore
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.proc.url

    def env(self, who: str = "a") -> dict[str, str]:
        """What a user sets to point E2B's SDKs here (docs/e2b.md)."""
        return {"E2B_API_KEY": self.keys[who], "E2B_API_URL": self.url,
                "E2B_SANDBOX_URL": self.url}
