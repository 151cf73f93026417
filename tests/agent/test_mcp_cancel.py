"""Cancelling a running ``run_code`` cell, over STDIO and HTTP, with the official client.

The client cancels the way it always does (``notifications/cancelled``, sent when the
caller's task gives up) at several moments after the call went out: before the server
has the request set up, before the kernel has the cell, and while the cell runs. Each
time the cell is interrupted (it never finishes), the context's variables are kept, and
the audit log has a ``cancelled`` line. One server, one kernel for every delay.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from _helpers import Uvicorn, stdio_params
from mcp import Client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.integration

DELAYS = (0.0, 0.01, 0.1, 1.0, 2.0)  # seconds from the request on the wire to the cancel
CELL = "import time\ntime.sleep(20)\nfinished = True"
# Blocks the kernel's event loop for a second once the cell that calls it is done: the
# next cell waits that long to be taken (as on a loaded host), and a SIGINT meanwhile is
# ignored by the idle kernel.
SETUP = ("import asyncio, time\n"
         "def stall():\n"
         "    asyncio.get_running_loop().call_soon(time.sleep, 1.0)\n"
         "x = 41\n"
         "stall()")
CHECK = "print(x, globals().pop('finished', False))\nstall()"


class _Watched:
    """A client write stream that says when a ``tools/call`` request went out."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.call_sent = anyio.Event()

    async def send(self, item: Any) -> None:
        await self._inner.send(item)
        if getattr(item.message, "method", None) == "tools/call":
            self.call_sent.set()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Watched:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)


class _Transport:
    """The SDK's own transport, with its write stream watched (a ``Transport``)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.writes: _Watched | None = None

    async def __aenter__(self) -> tuple[Any, _Watched]:
        read, write = await self._inner.__aenter__()
        self.writes = _Watched(write)
        return read, self.writes

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)


@asynccontextmanager
async def _connected(transport: _Transport) -> AsyncIterator[Client]:
    async with Client(transport, mode="legacy") as client:  # type: ignore[arg-type]
        yield client


async def _cancel_after(client: Client, transport: _Transport, delay: float) -> None:
    """Start the long cell; cancel it ``delay`` s after its request was written."""
    assert transport.writes is not None
    transport.writes.call_sent = anyio.Event()
    scope = anyio.CancelScope()

    async def call() -> None:
        with scope:
            await client.call_tool("run_code", {"code": CELL})
            raise AssertionError("the cancelled call was answered")

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await transport.writes.call_sent.wait()
        await anyio.sleep(delay)
        scope.cancel()  # the client sends notifications/cancelled for it


def _text(result: Any) -> str:
    return result.content[0].text if result.content else ""


async def _loop(client: Client, transport: _Transport) -> list[str]:
    r = await client.call_tool("run_code", {"code": SETUP})
    assert not r.is_error, _text(r)
    seen = []
    for delay in DELAYS:
        await _cancel_after(client, transport, delay)
        # Waits for the cancelled cell's kernel (one cell at a time): a cell that was
        # not interrupted would finish first and set `finished`.
        with anyio.fail_after(60):
            r = await client.call_tool("run_code", {"code": CHECK})
        data = r.structured_content or {}
        seen.append(f"{delay}: {data.get('stdout', '')!r}"
                    + (f" ({_text(r)!r})" if data.get("error") or r.is_error else ""))
    return seen


def _check(seen: list[str], audit: Path) -> None:
    assert seen == [f"{d}: '41 False\\n'" for d in DELAYS], seen
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    statuses = [e["status"] for e in lines if e["tool"] == "run_code"]
    assert statuses == ["ok"] + ["cancelled", "ok"] * len(DELAYS), statuses
    for e in lines:
        if e["status"] == "cancelled":
            assert e["error_code"] == "cancelled" and e["sandbox_id"], e


def test_cancel_run_code_over_stdio(tmp_path: Path) -> None:
    audit = tmp_path / "audit.log"

    async def main() -> list[str]:
        transport = _Transport(stdio_client(stdio_params(ABX_MCP_AUDIT_LOG=str(audit))))
        async with _connected(transport) as client:
            return await _loop(client, transport)

    _check(anyio.run(main), audit)


def test_cancel_run_code_over_http(tmp_path: Path) -> None:
    audit = tmp_path / "audit.log"
    server = Uvicorn(ABX_MCP_AUDIT_LOG=str(audit), ABX_MCP_TEMPLATE="code-interpreter-v1")
    try:
        async def main() -> list[str]:
            transport = _Transport(streamable_http_client(server.url + "/mcp"))
            async with _connected(transport) as client:
                return await _loop(client, transport)

        _check(anyio.run(main), audit)
    finally:
        server.stop()
