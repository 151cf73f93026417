"""Dependencies every router shares: the gateway state, the caller, the checked sandbox."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from agent_sandbox.runtime import validate
from agent_sandbox.server.auth import Principal, check_sandbox, principal
from agent_sandbox.server.schemas import SANDBOX_ID_PATTERN, whole_match
from agent_sandbox.server.state import GatewayState


def gateway(request: Request) -> GatewayState:
    return request.app.state.gateway


State = Annotated[GatewayState, Depends(gateway)]
Caller = Annotated[Principal, Depends(principal)]


def owned_sandbox(state: State, who: Caller, sandbox_id: Annotated[str, Path(
        json_schema_extra={"pattern": SANDBOX_ID_PATTERN}, description="`sbx-` and 10 "
        "lowercase letters or digits")]) -> str:
    """The path's sandbox id, once the caller is known to own it (404 otherwise)."""
    whole_match(SANDBOX_ID_PATTERN, validate.sandbox_id(sandbox_id), "sandbox id")
    return check_sandbox(state, who, sandbox_id)


SandboxId = Annotated[str, Depends(owned_sandbox)]
