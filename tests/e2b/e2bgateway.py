"""The gateway the E2B tests point E2B's SDKs at (not in conftest.py: another directory's
conftest may own that module name)."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx2 as httpx

from agent_sandbox.surfaces.gateway.process import GatewayProcess
from agent_sandbox.surfaces.http.keys import KeyStore


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

    def kill_sandbox(self, sandbox_id: str, who: str = "a") -> bool:
        """Kill a sandbox through E2B's control plane (as its key ``who``), as soon as a
        test is done with it: one whose processes still run (floods) must not hold the
        shared gateway and host back for the tests after it. False: it was gone."""
        reply = httpx.delete(f"{self.url}/sandboxes/{sandbox_id}", timeout=120,
                             headers={"X-API-KEY": self.keys[who]})
        assert reply.status_code in (204, 404), reply.text
        return reply.status_code == 204
