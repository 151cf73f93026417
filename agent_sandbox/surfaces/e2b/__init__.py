"""E2B's API on the gateway: its control plane (``control``) and what E2B's SDKs address to a
sandbox (``routing``: envd, the code interpreter, a sandbox's ports), so unmodified
``e2b`` / ``e2b-code-interpreter`` code runs against ``abx serve`` (docs/e2b.md)."""

from __future__ import annotations

from agent_sandbox.surfaces.e2b.routing import (
    ENVD_PORT,
    INTERPRETER_PORT,
    ASGIApp,
    SandboxRouter,
)
from agent_sandbox.surfaces.e2b.tokens import AccessTokens
from agent_sandbox.surfaces.http.state import GatewayState


def front(app: ASGIApp, state: GatewayState) -> SandboxRouter:
    """``app`` (the gateway's API) behind E2B's: what is E2B's is answered here, the rest
    goes on to ``app``."""
    from agent_sandbox.surfaces.e2b import control, envd, interpreter

    tokens = AccessTokens(state.keys.path.parent)
    return SandboxRouter(app, state, tokens,
                         {ENVD_PORT: envd.application(),
                          INTERPRETER_PORT: interpreter.application()},
                         control.application(state, tokens))
