"""Dependencies every router shares: the gateway state, the caller, the checked sandbox."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from agent_sandbox.server.auth import Principal, check_sandbox, principal
from agent_sandbox.server.state import GatewayState


def gateway(request: Request) -> GatewayState:
    return request.app.state.gateway


State = Annotated[GatewayState, Depends(gateway)]
Caller = Annotated[Principal, Depends(principal)]


def owned_sandbox(state: State, who: Caller,
                  sandbox_id: Annotated[str, Path(max_length=300)]) -> str:
    """The path's sandbox id, once the caller is known to own it (404 otherwise)."""
    return check_sandbox(state, who, sandbox_id)


SandboxId = Annotated[str, Depends(owned_sandbox)]
