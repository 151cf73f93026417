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

from dataclasses import dataclass

from fastapi import Request

from agent_sandbox.errors import NotFoundError, UnauthenticatedError
from agent_sandbox.netpolicy import NetworkPolicy
from agent_sandbox.runtime import validate
from agent_sandbox.server.keys import ApiKey, KeyStore
from agent_sandbox.server.peercred import PeerCred, peer_of
from agent_sandbox.server.state import GatewayState


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


def principal(request: Request) -> Principal:
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
    return authenticate(state.keys, _token(request))


def require_admin(who: Principal) -> None:
    if not who.admin:
        # Not 403: an ordinary key learns nothing about what admins can see.
        raise NotFoundError("not found")


def check_sandbox(state: GatewayState, who: Principal, sandbox_id: str) -> str:
    """The id, if this caller may use that sandbox; otherwise the engine's own 404."""
    validate.sandbox_id(sandbox_id)
    if who.admin:
        return sandbox_id
    try:
        owner = state.provider.info(sandbox_id).owner
    except NotFoundError:
        owner = None
    if owner != who.owner:
        raise NotFoundError(f"sandbox {sandbox_id} not found (it may have been killed)")
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
