"""Which tool calls run now: a cap for the server, and a fair share for each session.

- At most ``total`` calls run at once (``ABX_MCP_MAX_CONCURRENCY``); a call beyond that is
  refused at once with ``busy`` and ``retry_after`` (``ServerBusy``).
- At most ``per_session`` calls of one session run at once (``ABX_MCP_SESSION_CONCURRENCY``);
  a session's further calls wait their turn, first come first served, so a client flooding
  long calls takes its share and no more: another session's call still starts at once.
  At most ``max_waiting`` calls of a session wait (beyond: ``busy`` as well).

A STDIO server has one client: its share is the whole server. Waiting calls hold no slot
and no thread; a cancelled waiter leaves the queue (or passes on a slot it was just given).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

from agent_sandbox.core.errors import ResourceExhaustedError
from agent_sandbox.sdk.twin import set_max_threads
from agent_sandbox.surfaces.mcp.config import AgentConfig

RETRY_AFTER_S = 1.0
# SDK threads beyond one per running call: session cleanup (kills), template lookups.
SPARE_THREADS = 16


class ServerBusy(ResourceExhaustedError):
    """Refused by the gate, not failed: the client should retry after ``retry_after`` s."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message}; retry after {RETRY_AFTER_S:g} s",
                         details={"retry_after": RETRY_AFTER_S})


class _Lane:
    """One session's calls: how many run, and the turns of those waiting."""

    __slots__ = ("running", "waiters")

    def __init__(self) -> None:
        self.running = 0
        self.waiters: deque[asyncio.Future[None]] = deque()


class CallGate:
    def __init__(self, total: int, per_session: int, max_waiting: int | None = None) -> None:
        if total < 1 or per_session < 1:
            raise ValueError("the call caps must be positive")
        self.total = total
        self.per_session = min(per_session, total)
        self.max_waiting = total if max_waiting is None else max_waiting
        self.running = 0
        self._lanes: dict[str, _Lane] = {}

    @classmethod
    def for_server(cls, config: AgentConfig, transport: str) -> CallGate:
        # Every admitted call needs an SDK worker thread while it talks to the engine.
        set_max_threads(config.max_concurrency + SPARE_THREADS)
        share = config.max_concurrency if transport == "stdio" else config.session_concurrency
        return cls(config.max_concurrency, share)

    @property
    def waiting(self) -> int:
        return sum(len(lane.waiters) for lane in self._lanes.values())

    @contextlib.asynccontextmanager
    async def admit(self, session: str) -> AsyncIterator[None]:
        """Hold a slot for one call of ``session`` (waiting for it if the session is at
        its share); ServerBusy if the server is full or too many calls already wait."""
        await self._enter(session)
        try:
            yield
        finally:
            self._leave(session)

    async def _enter(self, session: str) -> None:
        if self.running >= self.total:
            raise ServerBusy(f"server busy: {self.total} tool calls already running")
        lane = self._lanes.get(session)
        if lane is None:
            lane = self._lanes[session] = _Lane()
        if lane.running < self.per_session and not lane.waiters:
            lane.running += 1
            self.running += 1
            return
        if len(lane.waiters) >= self.max_waiting:
            raise ServerBusy(f"this session already has {lane.running} tool calls running "
                             f"and {len(lane.waiters)} waiting")
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lane.waiters.append(turn)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._leave(session)  # given a slot just as it was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):  # _leave may have dropped it
                    lane.waiters.remove(turn)
            raise
        # The finishing call handed its slot over: the counts already include this one.

    def _leave(self, session: str) -> None:
        lane = self._lanes[session]
        while lane.waiters:
            turn = lane.waiters.popleft()
            if not turn.done():  # a cancelled waiter is skipped
                turn.set_result(None)
                return
        lane.running -= 1
        self.running -= 1
        if lane.running == 0:
            del self._lanes[session]
