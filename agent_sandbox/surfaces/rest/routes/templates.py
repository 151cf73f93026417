"""/v1/templates: build one from a recipe (a Dockerfile) with its steps' output streamed
as NDJSON events, get, delete, and prune unused layers. A key sees the host's templates
and its own; a template it built is its own (others cannot see, use, replace or delete
it)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from agent_sandbox.core.errors import NotFoundError, WrongStateError
from agent_sandbox.core.models import TemplateInfo
from agent_sandbox.core.network import parse as parse_policy
from agent_sandbox.surfaces.http.auth import Principal, check_network, require_admin
from agent_sandbox.surfaces.http.streaming import Emit, ndjson_response
from agent_sandbox.surfaces.rest.routes.deps import Caller, State
from agent_sandbox.surfaces.rest.schemas import BuildTemplate, base64_bytes

router = APIRouter(prefix="/v1/templates", tags=["templates"])
_NDJSON = "application/x-ndjson"


def visible(info: TemplateInfo, who: Principal) -> bool:
    return who.admin or info.owner in ("", who.owner)


def check_build_network(state: Any, who: Principal) -> None:
    """The network a build's RUN steps get (the operator's) within the key's ceiling."""
    config = getattr(state.provider, "config", None)
    if config is not None:
        check_network(state, who, parse_policy(config.build_network))


def template_of(state: Any, who: Principal, name: str) -> TemplateInfo:
    """``name`` as the caller may see it (another tenant's is not found)."""
    for info in state.provider.list_templates():
        if info.name == name and visible(info, who):
            return info
    raise NotFoundError(f"template {name!r} not found")


def build_events(state: Any, who: Principal, name: str, recipe: str,
                 context: bytes | None) -> Any:
    """The build as work for a stream: each event emitted, the template last."""
    build = getattr(state.provider, "build_recipe", None)
    if build is None:
        raise WrongStateError("this gateway's engine does not build templates from recipes")
    check_build_network(state, who)

    def work(emit: Emit) -> dict[str, Any]:
        info = build(name, recipe, context_tar=context, on_event=emit, owner=who.owner)
        return {"type": "result", "template": info.model_dump()}

    return work


@router.post("", responses={200: {"content": {_NDJSON: {}}}})
async def build_template(body: BuildTemplate, state: State, who: Caller) -> Any:
    """Build a template from a recipe, a cached layer per step, each RUN in a sandbox.
    Answers NDJSON events as the build goes: ``step`` (n of m, cached or not), ``log``
    (a step's output), ``step_done``, ``done``, then ``result`` (the template) or
    ``error``."""
    context = base64_bytes(body.context_base64, "context_base64")
    return await ndjson_response(build_events(state, who, body.name, body.recipe, context))


@router.get("/{name}")
def get_template(name: str, state: State, who: Caller) -> TemplateInfo:
    return template_of(state, who, name)


@router.delete("/{name}", status_code=204)
def delete_template(name: str, state: State, who: Caller) -> Response:
    info = template_of(state, who, name)
    if info.owner != who.owner and not who.admin:
        raise NotFoundError(f"template {name!r} not found")
    if not info.owner:
        require_admin(who)  # the host's own templates are the operator's
    state.provider.remove_template(name)
    return Response(status_code=204)


@router.post("/prune")
def prune_layers(state: State, who: Caller) -> dict[str, int]:
    """Remove the recipe layers no template or sandbox uses (an admin key)."""
    require_admin(who)
    layers, freed = state.provider.prune_layers()
    return {"layers": layers, "bytes": freed}
