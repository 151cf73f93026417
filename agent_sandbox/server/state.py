"""What one gateway process holds: the provider, the key store, quotas, metrics and the
operator's network ceiling."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent_sandbox.netpolicy import NetworkPolicy
from agent_sandbox.providers.base import Provider
from agent_sandbox.server.keys import KeyStore
from agent_sandbox.server.metrics import Metrics
from agent_sandbox.server.quotas import Quotas
from agent_sandbox.server.watch_relay import WatchSlots


@dataclass
class GatewayState:
    provider: Provider  # the gateway asks nothing of what runs sandboxes beyond it
    keys: KeyStore
    quotas: Quotas = field(default_factory=Quotas)
    metrics: Metrics = field(default_factory=Metrics)
    watches: WatchSlots = field(default_factory=WatchSlots)
    # ABX_GATEWAY_NETWORK_CEILING: no sandbox of this gateway gets more network.
    network_ceiling: NetworkPolicy = field(default_factory=lambda: NetworkPolicy(mode="full"))
