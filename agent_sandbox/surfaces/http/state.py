"""What one gateway process holds: the provider, the key store, quotas, metrics and the
operator's network ceiling."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.provider import Provider
from agent_sandbox.surfaces.http.keys import KeyStore
from agent_sandbox.surfaces.http.metrics import Metrics
from agent_sandbox.surfaces.http.quotas import Quotas
from agent_sandbox.surfaces.http.watch_relay import WatchSlots


@dataclass
class GatewayState:
    provider: Provider  # the gateway asks nothing of what runs sandboxes beyond it
    keys: KeyStore
    quotas: Quotas = field(default_factory=Quotas)
    metrics: Metrics = field(default_factory=Metrics)
    watches: WatchSlots = field(default_factory=WatchSlots)
    # ABX_GATEWAY_NETWORK_CEILING: no sandbox of this gateway gets more network.
    network_ceiling: NetworkPolicy = field(default_factory=lambda: NetworkPolicy(mode="full"))
