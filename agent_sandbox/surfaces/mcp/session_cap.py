"""Room for a new HTTP session when the cap is reached: evict one that holds nothing.

Health checks (``claude mcp list``, the MCP Inspector CLI) open a session, list the tools
and leave without DELETE. Left to the idle TTL (an hour), a handful of them would fill the
cap and every new client would get 503. So when the cap is reached, the session that made
no sandbox, has no request in flight and was used least recently is ended to make room.
Sessions that hold sandboxes are never evicted: their owners would lose work.
"""

from __future__ import annotations

import logging
from typing import Any

from agent_sandbox.surfaces.mcp.sessions import SessionRegistry

log = logging.getLogger("agent_sandbox.surfaces.mcp")


class SessionCap:
    def __init__(self, manager: Any, registry: SessionRegistry) -> None:
        # The SDK's StreamableHTTPSessionManager: its session table has no public accessor
        # in mcp 2.3, so the transports are read from `_server_instances`.
        self._manager = manager
        self._registry = registry

    @property
    def limit(self) -> int | None:
        return self._manager.max_sessions  # type: ignore[no-any-return]

    def _open(self) -> dict[str, Any]:
        return self._manager._server_instances  # type: ignore[no-any-return]  # noqa: SLF001

    def full(self) -> bool:
        return self.limit is not None and len(self._open()) >= self.limit

    def _victim(self) -> tuple[str, Any] | None:
        best: tuple[float, str, Any] | None = None
        for sid, transport in list(self._open().items()):
            if getattr(transport, "_requests_in_flight", 1) or transport.is_terminated:
                continue  # busy (or already going): leave it be
            state = self._registry.peek(sid)
            if state is not None and state.sandboxes:
                continue
            seen = state.last_seen if state is not None else 0.0
            if best is None or seen < best[0]:
                best = (seen, sid, transport)
        return None if best is None else best[1:]

    async def make_room(self) -> bool:
        """True if a new session may open (evicting an empty one if needed)."""
        while self.full():
            victim = self._victim()
            if victim is None:
                return False
            sid, transport = victim
            log.info("session cap (%s) reached: ending idle empty session %s", self.limit,
                     sid[:12])
            await self._manager._discard_session(sid, transport)  # noqa: SLF001
            await self._registry.end(sid)
        return True

    def refusal(self) -> str:
        return (f"too many open MCP sessions ({self.limit}), each holding sandboxes or a "
                "request in flight; end one (HTTP DELETE /mcp with its Mcp-Session-Id), wait "
                "for one to expire (ABX_MCP_SESSION_TTL), or raise ABX_MCP_MAX_SESSIONS")
