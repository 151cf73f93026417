"""Which sandbox (and which of its ports) an E2B sandbox-addressed request is for, as the
router checked it; the services read it back with ``current()``."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

import anyio.to_thread

from agent_sandbox.core.errors import SandboxError
from agent_sandbox.core.provider import Provider
from agent_sandbox.core.states import SandboxState
from agent_sandbox.surfaces.http.keys import ApiKey
from agent_sandbox.surfaces.http.state import GatewayState


@dataclass(frozen=True)
class Target:
    state: GatewayState
    sandbox_id: str  # exists, and the request carried its access token
    owner: str  # the tenant the sandbox belongs to ("" on an open gateway)
    port: int  # 49983 (envd), 49999 (code interpreter) or a port of the sandbox's own
    user: str | None  # the E2B username the request names (Basic auth); None: the default

    @property
    def provider(self) -> Provider:
        return self.state.provider

    def api_key(self) -> ApiKey | None:
        """The key the sandbox belongs to, whose quotas its calls take (None: an open
        gateway, or a key since removed). Blocking: a key store read."""
        if not self.owner:
            return None
        try:
            return self.state.keys.get(self.owner)
        except SandboxError:
            return None


class SandboxLost(Exception):  # noqa: N818 - a signal to the router, not an error shown
    """Raised by a streaming response whose sandbox is gone mid-stream: the router ends
    the connection without completing the response, as a sandbox's end cuts E2B's, so the
    SDK asks the sandbox's health and raises that it was killed."""


async def still_running(found: Target) -> bool:
    """Whether the request's sandbox still exists and runs (a blocking read, in a thread)."""
    try:
        info = await anyio.to_thread.run_sync(found.provider.info, found.sandbox_id)
    except SandboxError:
        return False
    return info.state == SandboxState.RUNNING


_current: ContextVar[Target] = ContextVar("abx_e2b_target")


def current() -> Target:
    """The request's target (set by ``routing`` for the duration of the request; tasks the
    request starts inherit it)."""
    return _current.get()


def bind(target: Target) -> object:
    return _current.set(target)


def unbind(token: object) -> None:
    _current.reset(token)  # type: ignore[arg-type]
