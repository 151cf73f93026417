"""Warm sandboxes: whole sandboxes (record, volume, running Pod) made ahead of time for
the pooled templates, marked ``pooled`` on their Secret. A create that fits (default
limits, no network, no volume) claims one in one API call: a patch of that Secret's
state and record, conditional on its version, so two claimants never get the same one.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from agent_sandbox.backends.kubernetes import objects
from agent_sandbox.backends.kubernetes.cluster import Conflict
from agent_sandbox.backends.kubernetes.pods import Live, live_of
from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import SandboxState
from agent_sandbox.service.record import SandboxRecord, new_id

if TYPE_CHECKING:
    from agent_sandbox.backends.kubernetes.backend import KubernetesBackend

log = logging.getLogger(__name__)
POOLED = SandboxState.POOLED


class PodPool:
    def __init__(self, provider: KubernetesBackend) -> None:
        self.provider = provider
        self.size = provider.config.pool_size
        self.templates = provider.config.pool_templates if self.size else ()

    def pooled(self, template: str) -> list[dict[str, Any]]:
        selector = (f"{objects.LABEL_ROLE}=sandbox,{objects.LABEL_STATE}={POOLED},"
                    f"{objects.LABEL_TEMPLATE}={template}")
        return self.provider.cluster.list("Secret", selector)

    def claim(self, template: str, fields: dict[str, Any]) -> Live | None:
        if template not in self.templates:
            return None
        sandboxes = self.provider.sandboxes
        for secret in self.pooled(template):
            live = live_of(secret, [])
            for name, value in fields.items():
                setattr(live.row, name, value)
            try:
                live = sandboxes.save(live, SandboxState.RUNNING)
            except (Conflict, SandboxError):
                continue  # another claimant took it first
            try:
                return sandboxes.live(live.row.id, fresh=True)  # with its Pod's address
            except SandboxError:
                continue
        return None

    def refill(self) -> None:
        """Make one warm sandbox for each pooled template that lacks one."""
        for template in self.templates:
            if len(self.pooled(template)) >= self.size:
                continue
            try:
                _, image = self.provider.catalog.get(template)
                sandbox_id = new_id()
                now = time.time()
                row = SandboxRecord(
                    id=sandbox_id, template=template, state=POOLED, created_at=now,
                    last_used=now, timeout=300.0, persistent=False,
                    network=NetworkPolicy(), volume_id=f"vol-{sandbox_id[4:]}",
                    limits=self.provider.config.limits.__dict__)
                self.provider.start_new(row, image, new_volume=True, state=POOLED)
            except SandboxError as exc:
                log.warning("warm pool: could not make a %s sandbox: %s", template, exc)

    def drain(self) -> int:
        """Destroy the warm sandboxes and stop refilling (a drain is for shutting down:
        a refill in flight would otherwise leave a new one behind)."""
        self.templates = ()
        count = 0
        for template in self.provider.config.pool_templates:
            for secret in self.pooled(template):
                live = live_of(secret, [])
                self.provider.destroy(live, delete_volume=True)
                count += 1
        return count

