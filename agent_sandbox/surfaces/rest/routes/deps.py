"""Dependencies every router shares: the gateway state, the caller, the checked sandbox."""

from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin

from fastapi import Depends, Path, Request, Security
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIWebSocketRoute
from fastapi.security import HTTPAuthorizationCredentials
from starlette.requests import HTTPConnection

from agent_sandbox.core import validate
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.surfaces.http.auth import BEARER, Principal, check_sandbox, principal
from agent_sandbox.surfaces.http.state import GatewayState
from agent_sandbox.surfaces.rest.schemas import SANDBOX_ID_PATTERN, whole_match


def gateway(request: Request) -> GatewayState:
    return request.app.state.gateway


# BEARER only puts the key in the OpenAPI document (and so in /docs' Authorize).
Documented = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]


def caller(request: Request, _: Documented) -> Principal:
    return principal(request)


def _query_params(dependant: Dependant) -> dict[str, bool]:
    """Each query parameter the endpoint takes: whether it takes several values."""
    names = {field.alias: _many(field.field_info.annotation)
             for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_params(sub)
    return names


def _many(annotation: Any) -> bool:
    return any(get_origin(t) in (list, tuple, set) or t in (list, tuple, set)
               for t in (annotation, *get_args(annotation)))


def known_query(connection: HTTPConnection) -> None:
    """Refuse a query parameter the endpoint does not take: a misspelt filter
    (``?stat=running``) would otherwise be ignored and answer as if none were given."""
    route = connection.scope.get("route")
    if not isinstance(route, APIRoute | APIWebSocketRoute):
        return
    names = _query_params(route.dependant)
    unknown = sorted(set(connection.query_params) - set(names))
    if unknown:
        takes = ", ".join(sorted(names)) if names else "none"
        raise InvalidArgumentError(f"unknown query parameter {unknown[0]!r}: "
                                   f"{connection.url.path} takes {takes}")
    for name, many in names.items():
        given = len(connection.query_params.getlist(name))
        if given > 1 and not many:  # which one was meant? (the last would silently win)
            raise InvalidArgumentError(f"query parameter {name!r} given {given} times: "
                                       "give it once")


State = Annotated[GatewayState, Depends(gateway)]
Caller = Annotated[Principal, Depends(caller)]


def owned_sandbox(request: HTTPConnection, state: State, who: Caller,
                  sandbox_id: Annotated[str, Path(
                      json_schema_extra={"pattern": SANDBOX_ID_PATTERN}, description="`sbx-` "
                      "and 10 lowercase letters or digits")]) -> str:
    """The path's sandbox id, once the caller is known to own it (404 otherwise)."""
    whole_match(SANDBOX_ID_PATTERN, validate.sandbox_id(sandbox_id), "sandbox id")
    return check_sandbox(state, who, sandbox_id, request)


SandboxId = Annotated[str, Depends(owned_sandbox)]
