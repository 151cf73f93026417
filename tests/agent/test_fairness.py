"""The call gate: the server's cap answers busy, a session's share makes its calls wait their
turn (first come first served) while other sessions' calls start at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agent_sandbox.sdk import twin
from agent_sandbox.surfaces.mcp.config import AgentConfig
from agent_sandbox.surfaces.mcp.fairness import RETRY_AFTER_S, CallGate, ServerBusy


class Calls:
    """Calls held open in the gate until released, recording the order they started in."""

    def __init__(self, gate: CallGate) -> None:
        self.gate = gate
        self.started: list[str] = []
        self.release: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, session: str, name: str) -> asyncio.Task[None]:
        self.release[name] = asyncio.Event()

        async def call() -> None:
            async with self.gate.admit(session):
                self.started.append(name)
                await self.release[name].wait()

        self.tasks[name] = asyncio.create_task(call())
        return self.tasks[name]

    async def finish(self, name: str) -> None:
        self.release[name].set()
        await self.tasks[name]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def run(test: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(test())


def test_a_flooding_session_waits_its_turn_while_others_start() -> None:
    async def main() -> None:
        calls = Calls(CallGate(total=10, per_session=2))
        for i in range(5):
            calls.start("flood", f"f{i}")
        await settle()
        assert calls.started == ["f0", "f1"] and calls.gate.waiting == 3
        calls.start("other", "o0")
        await settle()
        assert calls.started[-1] == "o0" and calls.gate.running == 3
        await calls.finish("f1")
        await settle()
        assert calls.started[-1] == "f2"  # first come, first served
        for name in ("f0", "f2", "o0", "f3", "f4"):
            await calls.finish(name)
            await settle()
        assert calls.started == ["f0", "f1", "o0", "f2", "f3", "f4"]
        assert calls.gate.running == 0 and calls.gate.waiting == 0
        assert not calls.gate._lanes  # noqa: SLF001 - no lane outlives its calls

    run(main)


def test_the_server_cap_answers_busy_with_retry_after() -> None:
    async def main() -> None:
        calls = Calls(CallGate(total=3, per_session=2))
        for session, name in (("a", "a0"), ("a", "a1"), ("b", "b0")):
            calls.start(session, name)
        await settle()
        with pytest.raises(ServerBusy) as busy:
            async with calls.gate.admit("c"):
                pass
        assert busy.value.code == "resource_exhausted"
        assert "3 tool calls already running" in busy.value.message
        assert busy.value.details == {"retry_after": RETRY_AFTER_S}
        for name in ("a0", "a1", "b0"):
            await calls.finish(name)
        assert calls.gate.running == 0

    run(main)


def test_too_many_waiting_calls_of_one_session_are_busy() -> None:
    async def main() -> None:
        calls = Calls(CallGate(total=10, per_session=1, max_waiting=1))
        calls.start("s", "s0")
        calls.start("s", "s1")
        await settle()
        with pytest.raises(ServerBusy, match="1 tool calls running and 1 waiting"):
            async with calls.gate.admit("s"):
                pass
        await calls.finish("s0")
        await settle()
        await calls.finish("s1")
        assert calls.gate.running == 0

    run(main)


def test_a_cancelled_waiter_leaves_the_queue_or_passes_its_slot_on() -> None:
    async def main() -> None:
        calls = Calls(CallGate(total=10, per_session=1))
        calls.start("s", "s0")
        calls.start("s", "s1")
        calls.start("s", "s2")
        await settle()
        calls.tasks["s1"].cancel()  # cancelled while waiting: leaves the queue
        await settle()
        assert calls.gate.waiting == 1
        # s0 ends and hands its slot to s2, which is cancelled before it runs: s2 must
        # pass the slot on (here: free it) rather than keep it.
        calls.release["s0"].set()
        await asyncio.sleep(0)
        calls.tasks["s2"].cancel()
        await settle()
        assert calls.started == ["s0"]
        assert calls.gate.running == 0 and not calls.gate._lanes  # noqa: SLF001
        for name in ("s1", "s2"):
            with pytest.raises(asyncio.CancelledError):
                await calls.tasks[name]

    run(main)


def test_one_client_stdio_server_never_queues_and_sizes_the_sdk_pool() -> None:
    config = AgentConfig(max_concurrency=2, session_concurrency=1)
    try:
        gate = CallGate.for_server(config, "stdio")
        assert twin.max_threads() == 2 + 16
        assert CallGate.for_server(config, "http").per_session == 1
    finally:
        twin.set_max_threads(twin.DEFAULT_MAX_THREADS)
    assert gate.per_session == 2

    async def main() -> None:
        calls = Calls(gate)
        calls.start("stdio", "a")
        calls.start("stdio", "b")
        await settle()
        with pytest.raises(ServerBusy):
            async with gate.admit("stdio"):
                pass
        await calls.finish("a")
        await calls.finish("b")

    run(main)
