"""Who is calling: the API key behind a request, and which sandboxes it may touch.

Keys are looked up on every request (one indexed SQLite read), so a key revoked with
``keys revoke`` in another process fails on its very next request. While no key was ever
created, a loopback-only gateway runs open: every caller is an anonymous admin.

Over the daemon's unix socket there are no keys: the peer's credentials (``SO_PEERCRED``,
see ``peercred``) are the identity. Each local user is a tenant of its own, shaped like a
key (id ``uid-<uid>``, the default quotas) so that ownership and quotas work unchanged;
root is that tenant with the admin flag.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.security import HTTPBearer
from starlette.requests import HTTPConnection

from agent_sandbox.core import validate
from agent_sandbox.core.errors import NotFoundError, PermissionDeniedError, UnauthenticatedError
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.surfaces.http.keys import ApiKey, KeyStore
from agent_sandbox.surfaces.http.peercred import PeerCred, peer_of
from agent_sandbox.surfaces.http.state import GatewayState


@dataclass(frozen=True)
class Principal:
    key: ApiKey | None  # None: an open (keyless, loopback) gateway
    peer: PeerCred | None = None  # set: a local user over the daemon's unix socket

    @property
    def owner(self) -> str:
        return self.key.id if self.key else ""

    @property
    def admin(self) -> bool:
        return self.key is None or self.key.admin


# The scheme as the OpenAPI document states it (Swagger UI's Authorize button at /docs).
# Only documentation: principal() reads the headers itself, X-API-Key too.
BEARER = HTTPBearer(auto_error=False, scheme_name="apiKey", description=(
    "An API key of this gateway (`abx keys create`), as `Authorization: Bearer abx_...` "
    "(or `X-API-Key: abx_...`). Clients of agent-sandbox take it from ABX_SANDBOX_API_KEY."))


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("x-api-key") or None


def authenticate(keys: KeyStore, token: str | None) -> Principal:
    if not keys.any_keys():
        return Principal(None)
    if not token:
        raise UnauthenticatedError("an API key is required: send 'Authorization: Bearer <key>'")
    key = keys.authenticate(token)
    if key is None:
        raise UnauthenticatedError("unknown or revoked API key")
    return Principal(key)


def local_user(peer: PeerCred, keys: KeyStore) -> Principal:
    """A local user of the daemon as a tenant: its uid is its identity, root is admin; its
    quotas are the ones a new key gets."""
    tenant = ApiKey(id=f"uid-{peer.uid}", name=peer.user, admin=peer.uid == 0, created_at=0.0,
                    revoked_at=None, max_sandboxes=keys.default_max_sandboxes,
                    max_commands=keys.default_max_commands)
    return Principal(tenant, peer)


def _loopback_name(host_header: str) -> bool:
    try:
        host = urlsplit(f"//{host_header}").hostname or ""
    except ValueError:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_open_caller(conn: HTTPConnection) -> None:
    """An open gateway (no keys) trusts whoever reaches its loopback port, and a web page
    in the user's browser reaches it too: a cross-site form post, or a name of the page's
    own re-pointed at 127.0.0.1 (DNS rebinding) to read the answers. So it answers only
    requests addressed to a loopback name, from no page of another origin."""
    host = conn.headers.get("host", "")
    if not _loopback_name(host):
        raise PermissionDeniedError(
            f"this gateway has no API keys, so it answers only requests addressed to a "
            f"loopback name (localhost, 127.0.0.1, [::1]), not Host {host[:100]!r}; to serve "
            "other names, create a key (`abx keys create`) and send it")
    origin = conn.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc.lower() != host.lower():
        raise PermissionDeniedError(
            f"a web page of another origin ({origin[:100]}) may not use this gateway: it has "
            "no API keys, so a page could otherwise act for whoever opens it")


def principal(request: HTTPConnection) -> Principal:
    """FastAPI dependency (sync: the key lookup is a blocking SQLite read)."""
    peer = peer_of(request.scope)
    state: GatewayState = request.app.state.gateway
    # Set by the E2B router for a sandbox's port it already checked (its access token):
    # an ASGI scope key, which no client can send.
    checked = request.scope.get("abx.principal")
    if isinstance(checked, Principal):
        return checked
    if peer is not None:  # the unix socket: PeerGuard already let only allowed peers in
        return local_user(peer, state.keys)
    who = authenticate(state.keys, _token(request))
    if who.key is None:
        check_open_caller(request)
    return who


def presented(request: Request) -> Principal | None:
    """The caller, if it says who it is (a key, the daemon's socket) or needs not (an open
    gateway); None for an anonymous caller of a gateway with keys. A key it presents must
    be a live one (401 otherwise)."""
    state: GatewayState = request.app.state.gateway
    if peer_of(request.scope) is None and _token(request) is None and state.keys.any_keys():
        return None
    return principal(request)


def require_admin(who: Principal) -> None:
    if not who.admin:
        # Not 403: an ordinary key learns nothing about what admins can see.
        raise NotFoundError("not found")


# An ASGI scope key: set by the audit middleware to a dict, marked here once the caller
# may use the sandbox (only such calls are its history). No client can set it.
AUDIT_SCOPE_KEY = "abx.audit"


def check_sandbox(state: GatewayState, who: Principal, sandbox_id: str,
                  conn: HTTPConnection | None = None) -> str:
    """The id, if this caller may use that sandbox; otherwise the engine's own 404."""
    validate.sandbox_id(sandbox_id)
    if not who.admin:
        try:
            owner = state.provider.info(sandbox_id).owner
        except NotFoundError:
            owner = None
        if owner != who.owner:
            raise NotFoundError(f"sandbox {sandbox_id} not found (it may have been killed)")
    mark = conn.scope.get(AUDIT_SCOPE_KEY) if conn is not None else None
    if isinstance(mark, dict):
        mark["allowed"] = True
    return sandbox_id


def check_volume(state: GatewayState, who: Principal, volume_id: str) -> None:
    if who.admin:
        return
    if not isinstance(volume_id, str) or state.keys.volume_owner(volume_id) != who.owner:
        raise NotFoundError(f"volume {volume_id!r} not found")


def check_network(state: GatewayState, who: Principal, policy: NetworkPolicy) -> None:
    """A sandbox's network (on create and on set_network) within the gateway's ceiling and
    the caller's key's own; otherwise PermissionDeniedError (403) naming the ceiling."""
    policy.check_within(state.network_ceiling, "this gateway's operator",
                        "the operator sets it with ABX_GATEWAY_NETWORK_CEILING (or `abx "
                        "serve --network-ceiling`)")
    key = who.key
    if key is not None and key.network_ceiling is not None:
        policy.check_within(key.network_ceiling, f"API key {key.name!r}",
                            "a key's ceiling is set when it is made (`abx keys create "
                            "--network POLICY`): ask the operator for a key with a higher one")
