"""What one gateway process holds: the engine, the key store, quotas and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent_sandbox.runtime.engine import Engine
from agent_sandbox.server.keys import KeyStore
from agent_sandbox.server.metrics import Metrics
from agent_sandbox.server.quotas import Quotas


@dataclass
class GatewayState:
    engine: Engine
    keys: KeyStore
    quotas: Quotas = field(default_factory=Quotas)
    metrics: Metrics = field(default_factory=Metrics)
