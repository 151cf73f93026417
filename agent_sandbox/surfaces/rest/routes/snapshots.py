"""/v1/snapshots: a sandbox's memory and files at one moment, and sandboxes started from
one (``POST /v1/sandboxes`` with ``snapshot``). A snapshot is its taker's key's, like a
sandbox: another key sees a 404."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from agent_sandbox.core.errors import NotFoundError
from agent_sandbox.core.models import SnapshotInfo
from agent_sandbox.core.validate import SNAPSHOT_ID_PATTERN, SNAPSHOT_NAME_PATTERN
from agent_sandbox.surfaces.http.auth import Principal
from agent_sandbox.surfaces.rest.routes.deps import Caller, SandboxId, State

SnapshotId = Annotated[str, Path(pattern=SNAPSHOT_ID_PATTERN,
                                 description="`snap-` and 10 lowercase letters or digits")]

router = APIRouter(tags=["snapshots"])


class TakeSnapshot(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, pattern=SNAPSHOT_NAME_PATTERN,
                             description="your label for it (up to 64 characters, no control "
                                         "characters)")


@router.post("/v1/sandboxes/{sandbox_id}/snapshots", status_code=201)
def take_snapshot(sandbox_id: SandboxId, state: State, who: Caller,
                  body: TakeSnapshot | None = None) -> SnapshotInfo:
    """Its processes, memory and files now; it runs on (stopped only for the checkpoint)."""
    return state.provider.snapshot(sandbox_id, body.name if body else None, owner=who.owner)


@router.get("/v1/snapshots")
def list_snapshots(state: State, who: Caller) -> list[SnapshotInfo]:
    return state.provider.list_snapshots(owner=None if who.admin else who.owner)


@router.get("/v1/snapshots/{snapshot_id}")
def get_snapshot(snapshot_id: SnapshotId, state: State, who: Caller) -> SnapshotInfo:
    return owned_snapshot(state.provider.snapshot_info(snapshot_id), who)


@router.delete("/v1/snapshots/{snapshot_id}", status_code=204)
def delete_snapshot(snapshot_id: SnapshotId, state: State, who: Caller) -> Response:
    owned_snapshot(state.provider.snapshot_info(snapshot_id), who)
    state.provider.delete_snapshot(snapshot_id)
    return Response(status_code=204)


def owned_snapshot(info: SnapshotInfo, who: Principal) -> SnapshotInfo:
    if not who.admin and info.owner != who.owner:
        raise NotFoundError(f"snapshot {info.snapshot_id} not found")
    return info
