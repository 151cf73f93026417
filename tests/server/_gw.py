"""The gateway under test, as the tests see it: its URL, key store and tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx2 as httpx

from agent_sandbox.remote import RemoteProvider
from agent_sandbox.surfaces.gateway.process import GatewayProcess
from agent_sandbox.surfaces.http.keys import KeyStore


@dataclass
class Gateway:
    proc: GatewayProcess
    keys: KeyStore
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.proc.url

    def provider(self, who: str | None) -> RemoteProvider:
        return RemoteProvider(self.url, self.tokens.get(who or "", None), retry_seconds=5)

    def http(self, who: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)
