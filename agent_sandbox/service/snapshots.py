"""Memory snapshots, once for every backend: take one of a sandbox, list, inspect and
delete them, and start sandboxes from one (a fork). The backend keeps the images and the
copies of the files; which snapshots a caller may see is its owner's (a gateway's key)."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from agent_sandbox.core import validate
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError
from agent_sandbox.core.models import SandboxInfo, SnapshotInfo
from agent_sandbox.core.spec import CreateSpec
from agent_sandbox.service.record import SandboxRecord, new_record

if TYPE_CHECKING:
    from agent_sandbox.service.backend import Backend

_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
# Options a fork takes from its snapshot: they are what its memory was made with.
_FROM_SNAPSHOT = ("template", "cpu", "memory_mb", "disk_mb", "volume")


def new_snapshot_id() -> str:
    return "snap-" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(10))


class SnapshotOps:
    backend: Backend

    if TYPE_CHECKING:  # the service's own
        def row(self, sandbox_id: str) -> SandboxRecord: ...
        def info(self, sandbox_id: str) -> SandboxInfo: ...

    def snapshot(self, sandbox_id: str, name: str | None = None, *,
                 owner: str = "") -> SnapshotInfo:
        """The sandbox's processes, memory and files now (it runs on: stopped only for the
        checkpoint; a paused one stays paused)."""
        label = validate.snapshot_name(name)
        row = self.row(sandbox_id)
        return self.backend.take_snapshot(row.id, new_snapshot_id(), label,
                                          owner or row.owner)

    def list_snapshots(self, owner: str | None = None) -> list[SnapshotInfo]:
        return sorted((s for s in self.backend.snapshots()
                       if owner is None or s.owner == owner), key=lambda s: s.created_at)

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        return self.backend.snapshot_source(validate.snapshot_id(snapshot_id))[0]

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.backend.delete_snapshot(validate.snapshot_id(snapshot_id))

    def fork(self, spec: CreateSpec, owner: str) -> SandboxInfo:
        """A new sandbox from a snapshot: its parent's template, limits, environment and
        files, its processes restored; the rest (timeout, network, metadata...) as asked."""
        assert spec.snapshot is not None
        snap, parent = self.backend.snapshot_source(spec.snapshot)
        if owner and snap.owner != owner:
            raise NotFoundError(f"snapshot {spec.snapshot} not found")
        asked = [name for name in _FROM_SNAPSHOT
                 if getattr(spec, name) not in (CreateSpec.model_fields[name].get_default(),
                                                getattr(parent, name, None))]
        if asked:
            raise InvalidArgumentError(
                f"a sandbox started from a snapshot has its snapshot's {', '.join(asked)}: "
                "leave them out (the memory it restores was made with those)")
        if spec.network.mode != "off":
            self.backend.check_network(spec.network)
        record = new_record(spec, owner, template=parent.template, limits=dict(parent.limits),
                            layers=[dict(layer) for layer in parent.layers],
                            envs={**parent.envs, **spec.envs})
        self.backend.make_from_snapshot(record, snap.snapshot_id)
        return self.info(record.id)
