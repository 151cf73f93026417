"""Templates, volumes, /health and /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse

from agent_sandbox.models import TemplateInfo, VolumeInfo
from agent_sandbox.server.auth import check_volume, require_admin
from agent_sandbox.server.routes._deps import Caller, State
from agent_sandbox.server.schemas import Health

router = APIRouter()


@router.get("/v1/templates", tags=["templates"])
def list_templates(state: State, who: Caller) -> list[TemplateInfo]:
    return state.provider.list_templates()


@router.get("/v1/volumes", tags=["volumes"])
def list_volumes(state: State, who: Caller) -> list[VolumeInfo]:
    owned = [v.model_copy(update={"owner": state.keys.volume_owner(v.volume_id) or ""})
             for v in state.provider.list_volumes()]
    return owned if who.admin else [v for v in owned if v.owner == who.owner]


@router.delete("/v1/volumes/{volume_id}", tags=["volumes"], status_code=204)
def delete_volume(volume_id: str, state: State, who: Caller) -> Response:
    check_volume(state, who, volume_id)
    state.provider.delete_volume(volume_id)
    state.keys.forget_volume(volume_id)
    return Response(status_code=204)


@router.get("/health", tags=["service"])
def health(state: State) -> Health:
    """Unauthenticated liveness: the engine's state database answers."""
    return Health(status="ok", sandboxes=len(state.provider.list()))


@router.get("/metrics", tags=["service"], response_class=PlainTextResponse)
def metrics(state: State, who: Caller) -> PlainTextResponse:
    """Prometheus text format; an admin key (or an open gateway) only."""
    require_admin(who)
    states = [s.state for s in state.provider.list()]
    return PlainTextResponse(state.metrics.render(states, state.provider.disk_headroom()),
                             media_type="text/plain; version=0.0.4")
