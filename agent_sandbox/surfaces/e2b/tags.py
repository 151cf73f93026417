"""E2B's template tags on the gateway (``Template.assign_tags``, ``remove_tags``,
``get_tags``, and ``tags=`` of ``Template.build``; ``catalog.py`` keeps them). Its own
router, included before the control plane's: ``/templates/tags`` is no template's id."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from agent_sandbox.core.errors import PermissionDeniedError
from agent_sandbox.core.models import TemplateInfo
from agent_sandbox.surfaces.e2b.catalog import Tags, check_tags, e2b_time, split_ref, template
from agent_sandbox.surfaces.e2b.templates import Caller, State
from agent_sandbox.surfaces.http.auth import Principal
from agent_sandbox.surfaces.http.state import GatewayState

router = APIRouter()


def _tags(request: Request) -> Tags:
    return request.app.state.template_tags


TagsDep = Annotated[Tags, Depends(_tags)]


class Assign(BaseModel):
    model_config = ConfigDict(extra="ignore")
    target: str = Field(max_length=300)
    tags: list[str] = Field(max_length=100)


class Remove(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(max_length=300)
    tags: list[str] = Field(max_length=100)


def _own(state: GatewayState, who: Principal, tags: Tags, ref: str) -> TemplateInfo:
    """The template ``ref`` names, if the caller's to tag."""
    info = template(state, who, tags.resolve(state, who, ref))
    if info.owner != who.owner or (not info.owner and not who.admin):
        raise PermissionDeniedError(f"template {info.name!r} is not yours to tag")
    return info


@router.post("/templates/tags", status_code=201)
def assign(body: Assign, state: State, who: Caller, tags: TagsDep) -> dict[str, Any]:
    info = _own(state, who, tags, body.target)
    build, _all = tags.change(info, add=check_tags(body.tags))
    return {"buildID": build, "tags": check_tags(body.tags)}


@router.delete("/templates/tags", status_code=204)
def remove(body: Remove, state: State, who: Caller, tags: TagsDep) -> Response:
    info = _own(state, who, tags, split_ref(body.name)[0])
    tags.change(info, remove=check_tags(body.tags))
    return Response(status_code=204)


@router.get("/templates/{template_id}/tags")
def listed(template_id: str, state: State, who: Caller, tags: TagsDep
           ) -> list[dict[str, Any]]:
    info = template(state, who, split_ref(template_id)[0])
    build, names = tags.of(info)
    at = e2b_time(info.created_at)
    return [{"tag": name, "buildID": build, "createdAt": at} for name in names]
