"""Per-session state: which sandboxes a client session made, its default one, cleanup.

A session sees only the sandboxes it created plus ``persistent`` ones; anything else is
reported as not found, so one agent cannot discover or touch another agent's sandboxes.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable

from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError
from agent_sandbox.sdk import AsyncSandbox

log = logging.getLogger("agent_sandbox.surfaces.mcp")


class SessionState:
    def __init__(self, session_id: str, transport: str) -> None:
        self.session_id = session_id
        self.transport = transport
        self.created_at = time.time()
        self.last_seen = time.monotonic()  # the last request (the session cap's LRU order)
        self.default_id: str | None = None
        self.sandboxes: dict[str, AsyncSandbox] = {}  # created by this session
        self.persistent: set[str] = set()  # of those, the ones that outlive the session
        self.closed = False
        # Serialises the lazy creation of the default sandbox (two first calls at once).
        self.create_lock = asyncio.Lock()
        # Sandboxes this session locked files in: its locks are released when it ends.
        self._locked_in: dict[str, AsyncSandbox] = {}

    @property
    def holder(self) -> str:
        """This session's name on its file locks, as others see it: a digest, never the
        id (an HTTP session's id is what lets a client act as it)."""
        digest = hashlib.sha256(self.session_id.encode()).hexdigest()[:12]
        return f"MCP session {digest}"

    def locked_in(self, sb: AsyncSandbox) -> None:
        self._locked_in.setdefault(sb.sandbox_id, sb)

    async def release_locks(self) -> None:
        """Release the file locks this session holds (a lock dies with its session)."""
        held, self._locked_in = self._locked_in, {}

        async def release(sb: AsyncSandbox) -> None:
            try:
                await sb.files.unlock_all(self.holder)
            except Exception:  # noqa: BLE001 - gone sandboxes took their locks along
                log.debug("could not release the locks of %s in %s", self.holder,
                          sb.sandbox_id)

        await asyncio.gather(*(release(sb) for sb in held.values()
                               if sb.sandbox_id not in self.sandboxes
                               or sb.sandbox_id in self.persistent))

    def adopt(self, sb: AsyncSandbox, persistent: bool) -> None:
        self.sandboxes[sb.sandbox_id] = sb
        if persistent:
            self.persistent.add(sb.sandbox_id)
        if self.default_id is None:
            self.default_id = sb.sandbox_id

    def forget(self, sandbox_id: str) -> None:
        self.sandboxes.pop(sandbox_id, None)
        self.persistent.discard(sandbox_id)
        if self.default_id == sandbox_id:
            self.default_id = None

    async def resolve(self, sandbox_id: str) -> AsyncSandbox:
        """The sandbox if this session may use it; NotFoundError otherwise."""
        sb = self.sandboxes.get(sandbox_id)
        if sb is not None:
            return sb
        try:
            other = await AsyncSandbox.connect(sandbox_id)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{exc.message}; list_sandboxes shows the ones you can "
                                       "use") from None
        except NotFoundError:
            other = None
        if other is None or not other._info.persistent:
            raise NotFoundError(f"no sandbox {sandbox_id!r} in this session; call list_sandboxes "
                                "to see the ones you can use")
        return other

    def may_see(self, sandbox_id: str, persistent: bool) -> bool:
        return persistent or sandbox_id in self.sandboxes

    async def close(self) -> int:
        """Kill every non-persistent sandbox this session created; returns how many."""
        if self.closed:
            return 0
        self.closed = True
        await self.release_locks()
        doomed = [sb for sid, sb in self.sandboxes.items() if sid not in self.persistent]
        self.sandboxes.clear()
        self.default_id = None

        async def kill(sb: AsyncSandbox) -> None:
            try:
                await sb.kill(delete_volume=True)
            except NotFoundError:
                pass
            except Exception:  # noqa: BLE001 - cleanup must go on with the others
                log.exception("could not kill sandbox %s at session end", sb.sandbox_id)

        await asyncio.gather(*(kill(sb) for sb in doomed))
        return len(doomed)


class SessionRegistry:
    """All live sessions of one server process."""

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self._sessions: dict[str, SessionState] = {}
        self.on_new: Callable[[SessionState], Awaitable[None] | None] | None = None

    def get(self, session_id: str) -> tuple[SessionState, bool]:
        """The session's state and whether it was just created."""
        state = self._sessions.get(session_id)
        if state is not None:
            return state, False
        state = SessionState(session_id, self.transport)
        self._sessions[session_id] = state
        return state, True

    def peek(self, session_id: str) -> SessionState | None:
        return self._sessions.get(session_id)

    async def end(self, session_id: str) -> int:
        state = self._sessions.pop(session_id, None)
        return await state.close() if state else 0

    async def end_all(self) -> int:
        ids = list(self._sessions)
        counts = await asyncio.gather(*(self.end(sid) for sid in ids))
        return sum(counts)

    def __len__(self) -> int:
        return len(self._sessions)

    def sandbox_count(self) -> int:
        return sum(len(s.sandboxes) for s in self._sessions.values())
