"""What the service knows of one sandbox, whichever backend keeps it (a SQLite row on this
host, a Secret's annotation in a cluster). Backends store every field and give it back."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.core.states import SandboxState

_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def new_id() -> str:
    """A sandbox id: ``sbx-`` and 10 random lowercase letters or digits."""
    return "sbx-" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(10))


@dataclass
class SandboxRecord:
    id: str
    template: str
    state: SandboxState
    created_at: float
    last_used: float
    timeout: float
    persistent: bool
    network: NetworkPolicy
    volume_id: str
    envs: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    # The overlay plan, frozen at create so a remount after reboot uses the same lowers.
    layers: list[dict[str, Any]] = field(default_factory=list)
    owner: str = ""
    helper_pid: int = 0
    # Its end of life (core.spec): seconds from created_at, the idle timeout's step, and
    # whether an end it comes to by itself keeps its volume.
    lifetime: float | None = None
    on_timeout: str = "pause"
    keep_volume: bool = True


# What a create gives a warm sandbox it claims (its template, limits and network are the
# pool's already: a create that asks other ones is not served from the pool).
CLAIMED = ("timeout", "persistent", "envs", "metadata", "owner", "lifetime", "on_timeout",
           "keep_volume")


def claimed_fields(record: SandboxRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in CLAIMED}


def new_record(spec: Any, owner: str, *, template: str, limits: dict[str, Any],
               layers: list[dict[str, Any]], envs: dict[str, str]) -> SandboxRecord:
    """A sandbox about to be made (state CREATING) from a checked ``core.spec.CreateSpec``:
    its life as the spec asks, the rest as given (a template's, or a snapshot's)."""
    now = time.time()
    record = SandboxRecord(
        id=new_id(), template=template, state=SandboxState.CREATING, created_at=now,
        last_used=now, timeout=spec.timeout, persistent=spec.persistent,
        network=spec.network, envs=envs, metadata=spec.metadata, limits=limits, owner=owner,
        volume_id="", lifetime=spec.lifetime, on_timeout=spec.on_timeout,
        keep_volume=spec.keep_volume, layers=layers)
    record.volume_id = spec.volume or f"vol-{record.id[4:]}"
    return record
