"""/v1/sandboxes: create, list, get, metrics, pause, resume, reset the system layer, timeout,
network, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from agent_sandbox.core.metrics import SandboxMetrics
from agent_sandbox.core.models import SandboxInfo, SandboxLogEntry
from agent_sandbox.core.spec import CreateSpec
from agent_sandbox.core.templates import NAME_PATTERN as TEMPLATE_NAME_PATTERN
from agent_sandbox.surfaces.http.auth import check_network, check_volume
from agent_sandbox.surfaces.rest.routes.deps import Caller, SandboxId, State
from agent_sandbox.surfaces.rest.schemas import SANDBOX_STATES, SetNetwork, SetTimeout

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"])


@router.post("", status_code=201)
def create_sandbox(body: CreateSpec, state: State, who: Caller) -> SandboxInfo:
    engine = state.provider
    check_network(state, who, body.network)
    if body.volume is not None:
        check_volume(state, who, body.volume)

    def live() -> int:
        return len(engine.list(owner=who.owner))

    with state.quotas.sandbox_slot(who.key, live):
        info = engine.create(**body.options(), owner=who.owner)
    state.keys.own_volume(info.volume_id, who.owner)
    return info


@router.get("")
def list_sandboxes(state: State, who: Caller,
                   template: Annotated[str | None, Query(pattern=TEMPLATE_NAME_PATTERN)] = None,
                   state_: Annotated[str | None, Query(alias="state", json_schema_extra={
                       "enum": list(SANDBOX_STATES)})] = None) -> list[SandboxInfo]:
    owner = None if who.admin else who.owner
    return state.provider.list(template=template, state=state_, owner=owner)


@router.get("/{sandbox_id}")
def get_sandbox(sandbox_id: SandboxId, state: State) -> SandboxInfo:
    return state.provider.info(sandbox_id)


@router.get("/{sandbox_id}/metrics")
def sandbox_metrics(sandbox_id: SandboxId, state: State,
                    start: Annotated[float | None, Query(ge=0)] = None,
                    end: Annotated[float | None, Query(ge=0)] = None) -> list[SandboxMetrics]:
    """Its CPU, memory and disk over time (a sample is read now when it runs; the kept
    ones between ``start`` and ``end``, Unix seconds, oldest first)."""
    return state.provider.metrics(sandbox_id, start, end)


@router.get("/{sandbox_id}/logs")
def sandbox_logs(sandbox_id: SandboxId, state: State) -> list[SandboxLogEntry]:
    """Its log, oldest first (the last 1000 lines): what happened to it (created, paused,
    resumed, its timeout or network changed) and its start command's output."""
    return state.provider.logs(sandbox_id)


@router.post("/{sandbox_id}/pause")
def pause_sandbox(sandbox_id: SandboxId, state: State) -> SandboxInfo:
    return state.provider.pause(sandbox_id)


@router.post("/{sandbox_id}/resume")
def resume_sandbox(sandbox_id: SandboxId, state: State) -> SandboxInfo:
    return state.provider.resume(sandbox_id)


@router.post("/{sandbox_id}/reset-rootfs")
def reset_rootfs(sandbox_id: SandboxId, state: State) -> SandboxInfo:
    return state.provider.reset_rootfs(sandbox_id)


@router.put("/{sandbox_id}/timeout", status_code=204)
@router.post("/{sandbox_id}/timeout", status_code=204)
def set_timeout(sandbox_id: SandboxId, body: SetTimeout, state: State) -> Response:
    state.provider.set_timeout(sandbox_id, body.timeout)
    return Response(status_code=204)


@router.put("/{sandbox_id}/network")
def set_network(sandbox_id: SandboxId, body: SetNetwork, state: State,
                who: Caller) -> SandboxInfo:
    """Change a sandbox's network policy without restarting it (a paused one gets it on
    resume); within the gateway's and the key's ceiling, else 403."""
    check_network(state, who, body.network)
    state.provider.set_network(sandbox_id, body.network)
    return state.provider.info(sandbox_id)


@router.delete("/{sandbox_id}", status_code=204)
def delete_sandbox(sandbox_id: SandboxId, state: State,
                   delete_volumes: bool = False) -> Response:
    volume_id = state.provider.info(sandbox_id).volume_id
    state.provider.kill(sandbox_id, delete_volume=delete_volumes)
    if delete_volumes:
        state.keys.forget_volume(volume_id)
    return Response(status_code=204)
