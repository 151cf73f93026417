"""Templates, volumes, /health and /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse

from agent_sandbox.core.errors import NotFoundError, RuntimeUnavailableError
from agent_sandbox.core.metrics import SandboxMetrics
from agent_sandbox.core.models import SandboxInfo, TemplateInfo, VolumeInfo
from agent_sandbox.core.provider import Provider
from agent_sandbox.core.states import SandboxState
from agent_sandbox.surfaces.http.auth import check_volume, presented, require_admin
from agent_sandbox.surfaces.rest.routes.deps import Caller, Documented, State
from agent_sandbox.surfaces.rest.schemas import Health

router = APIRouter()


@router.get("/v1/templates", tags=["templates"])
def list_templates(state: State, who: Caller) -> list[TemplateInfo]:
    """The host's templates and the caller's own (those its key built from recipes)."""
    return [t for t in state.provider.list_templates()
            if who.admin or t.owner in ("", who.owner)]


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


# A key is optional here: the `{}` added to its security in the document says so.
@router.get("/health", tags=["service"], response_model_exclude_none=True,
            openapi_extra={"security": [{}]})
def health(request: Request, state: State, _: Documented) -> Health:
    """Liveness, with no key: the engine's state database answers. With a key (or over the
    daemon's socket, or on an open gateway) also the live sandboxes the caller may see:
    an anonymous caller learns nothing about what runs here."""
    infos = state.provider.list()
    who = presented(request)
    if who is None:
        return Health(status="ok")
    return Health(status="ok", sandboxes=sum(1 for i in infos
                                             if who.admin or i.owner == who.owner))


@router.get("/metrics", tags=["service"], response_class=PlainTextResponse)
def metrics(state: State, who: Caller) -> PlainTextResponse:
    """Prometheus text format; an admin key (or an open gateway) only."""
    require_admin(who)
    infos = state.provider.list()
    text = state.metrics.render([s.state for s in infos], state.provider.disk_headroom(),
                                _usage(state.provider, infos))
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


def _usage(provider: Provider, infos: list[SandboxInfo]) -> dict[str, SandboxMetrics]:
    """Each running sandbox's latest sample, read now (none where the backend reads none:
    the memory and Kubernetes backends; a sandbox gone since the listing)."""
    found: dict[str, SandboxMetrics] = {}
    for info in infos:
        if info.state != SandboxState.RUNNING:
            continue
        try:
            samples = provider.metrics(info.sandbox_id)
        except (RuntimeUnavailableError, NotFoundError):
            continue
        if samples:
            found[info.sandbox_id] = samples[-1]
    return found
