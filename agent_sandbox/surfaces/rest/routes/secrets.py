"""/v1/secrets: a key's own secrets (docs/secrets.md). A value goes in once and never
comes out: every answer is the rule alone. Each key (each local user on the daemon) has
its own; sandboxes it creates may name them (``"secrets": [...]`` in the create body)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from pydantic import Field

from agent_sandbox.core.secrets import (
    MAX_VALUE,
    MIN_VALUE,
    NAME_PATTERN,
    SecretInfo,
    SecretRule,
    check_name,
)
from agent_sandbox.surfaces.rest.routes.deps import Caller, State

router = APIRouter(prefix="/v1/secrets", tags=["secrets"])


class CreateSecret(SecretRule):
    value: str = Field(min_length=MIN_VALUE, max_length=MAX_VALUE,
                       description="the secret; never returned")
    replace: bool = Field(False, description="replace a secret of the same name")


@router.post("", status_code=201)
def create_secret(body: CreateSecret, state: State, who: Caller) -> SecretInfo:
    rule = SecretRule(**body.model_dump(exclude={"value", "replace"}))
    return state.provider.create_secret(rule, body.value, replace=body.replace,
                                        owner=who.owner)


@router.get("")
def list_secrets(state: State, who: Caller) -> list[SecretInfo]:
    return state.provider.list_secrets(owner=who.owner)


@router.delete("/{name}", status_code=204)
def delete_secret(name: Annotated[str, Path(pattern=NAME_PATTERN)], state: State,
                  who: Caller) -> Response:
    state.provider.delete_secret(check_name(name), owner=who.owner)
    return Response(status_code=204)
