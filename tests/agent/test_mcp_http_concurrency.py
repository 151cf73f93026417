"""Concurrent tool calls over HTTP on a real server: no hidden ceiling, a fair share per
session, and a JSON answer unless the call streams progress.

Overlap and order are read from timestamps the commands print inside their sandboxes (one
host clock), never from how long the test took.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from _helpers import Uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcpwire import INIT, rpc_body

pytestmark = pytest.mark.integration

# Prints when it started and when it ended (seconds since the epoch, the host's clock).
STAMPED = "date +%s.%N; sleep {s}; date +%s.%N"


@pytest.fixture(scope="module")
def srv() -> Iterator[Uvicorn]:
    server = Uvicorn(ABX_MCP_MAX_CONCURRENCY="32", ABX_MCP_SESSION_CONCURRENCY="4")
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def sessions(url: str, n: int) -> Any:
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=120))
        clients = [await stack.enter_async_context(Client(
            streamable_http_client(url + "/mcp", http_client=http), mode="legacy"))
            for _ in range(n)]
        for c in clients:  # each session's default sandbox exists before the test proper
            r = await c.call_tool("run_command", {"command": "true"})
            assert not r.is_error, r
        yield clients


def stamps(result: Any) -> tuple[float, float]:
    assert not result.is_error, result.content
    start, end = result.structured_content["stdout"].split()
    return float(start), float(end)


def test_calls_of_several_sessions_run_at_once(srv: Uvicorn) -> None:
    """12 calls across 3 sessions (4 each, within the share): every one starts before any
    ends. asyncio.to_thread's pool (CPUs + 4 threads) held the 7th back on 2 cores."""

    async def main() -> list[tuple[float, float]]:
        async with sessions(srv.url, 3) as clients:
            results: list[Any] = []

            async def one(c: Client) -> None:
                results.append(await c.call_tool("run_command", {"command": STAMPED.format(s=4)}))

            async with anyio.create_task_group() as tg:
                for i in range(12):
                    tg.start_soon(one, clients[i % 3])
            return [stamps(r) for r in results]

    runs = anyio.run(main)
    assert len(runs) == 12
    last_start = max(s for s, _ in runs)
    first_end = min(e for _, e in runs)
    assert last_start < first_end, sorted(runs)


def test_a_flooding_session_does_not_hold_back_another(srv: Uvicorn) -> None:
    """Session A sends 8 long calls (its share is 4: the rest wait their turn); session B's
    short call still starts while A's first ones run."""

    async def main() -> tuple[list[tuple[float, float]], float]:
        async with sessions(srv.url, 2) as (a, b):
            flood: list[Any] = []

            async def long(c: Client) -> None:
                flood.append(await c.call_tool("run_command", {"command": STAMPED.format(s=4)}))

            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(long, a)
                with anyio.fail_after(60):  # A holds its share before B asks
                    while httpx.get(srv.url + "/health").json()["in_flight"] < 4:
                        await anyio.sleep(0.05)
                r = await b.call_tool("run_command", {"command": "date +%s.%N"})
                assert not r.is_error, r.content
                b_started = float(r.structured_content["stdout"])
            return [stamps(r) for r in flood], b_started

    runs, b_started = anyio.run(main)
    runs.sort()
    first, rest = runs[:4], runs[4:]
    assert b_started < min(e for _, e in first), (b_started, runs)
    # A never ran more than its share: its later calls started as earlier ones ended.
    assert min(s for s, _ in rest) >= min(e for _, e in first), runs


def test_json_answer_unless_progress_is_streamed(srv: Uvicorn) -> None:
    """A call that asks no progress is answered with one JSON body (even to a client that
    accepts only JSON); one with a progress token gets an SSE stream with its progress."""
    plain = {"Content-Type": "application/json", "Accept": "application/json"}
    r = httpx.post(srv.url + "/mcp", json=INIT, headers=plain)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    sid = {"Mcp-Session-Id": r.headers["mcp-session-id"]}
    httpx.post(srv.url + "/mcp", headers={**plain, **sid},
               json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "run_command", "arguments": {"command": "echo hi"}}}
    r = httpx.post(srv.url + "/mcp", json=call, headers={**plain, **sid}, timeout=60)
    assert r.headers["content-type"] == "application/json", r.headers
    assert rpc_body(r)["result"]["structuredContent"]["stdout"] == "hi\n"
    both = {**plain, **sid, "Accept": "application/json, text/event-stream",
            "Mcp-Protocol-Version": "2025-06-18"}
    loop = "for i in 1 2 3; do echo s$i; sleep 0.3; done"
    streamed = {**call, "id": 3, "params": {"name": "run_command", "arguments": {
        "command": loop}, "_meta": {"progressToken": 9}}}
    r = httpx.post(srv.url + "/mcp", json=streamed, headers=both, timeout=60)
    assert r.headers["content-type"].startswith("text/event-stream"), r.headers
    assert r.text.count('"notifications/progress"') >= 2, r.text
    answer = [line for line in r.text.splitlines() if line.startswith("data:")][-1]
    assert json.loads(answer[5:])["result"]["structuredContent"]["stdout"] == "s1\ns2\ns3\n"
    httpx.delete(srv.url + "/mcp", headers=sid)

    async def official(loop: str) -> list[str]:
        messages: list[str] = []

        async def progress(p: float, total: float | None, message: str | None) -> None:
            messages.append(message or "")

        async with sessions(srv.url, 1) as (c,):
            r = await c.call_tool("run_command", {"command": loop}, progress_callback=progress)
            assert not r.is_error
        return messages

    assert "".join(anyio.run(official, loop)) == "s1\ns2\ns3\n"
