"""Concurrent edits lose nothing (issue 29), end to end on real runc: two MCP servers (two
sessions, two processes) and a REST client race read-modify-write cycles on one file
through one gateway, with if_match and retries, and keep every increment; a session's
lock dies with its session; a killed client's lock lapses at its TTL."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

import anyio
import pytest
from _gw import Gateway
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from agent_sandbox.core.errors import ConflictError, LockedError, ResourceExhaustedError
from agent_sandbox.sdk import Sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.integration]
COUNTER = "/workspace/counter"
PER = 8  # increments per client


def _env(gw: Gateway) -> dict[str, str]:
    return {**os.environ, "ABX_MCP_AUDIT_LOG": "", "ABX_SANDBOX_BASE_URL": gw.url,
            "ABX_SANDBOX_API_KEY": gw.tokens["admin"]}


def _params(gw: Gateway) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "agent_sandbox.surfaces.mcp"], env=_env(gw),
                                 cwd=ROOT)


async def _tool(c: Client, name: str, **args: Any) -> tuple[bool, dict[str, Any]]:
    r = await c.call_tool(name, args)
    return bool(r.is_error), dict(r.structured_content or {})


async def _mcp_increments(gw: Gateway, sid: str) -> None:
    async with Client(_params(gw), mode="legacy") as c:
        for _ in range(PER):
            while True:
                err, read = await _tool(c, "read_file", sandbox_id=sid, path=COUNTER)
                assert not err, read
                err, wrote = await _tool(c, "write_file", sandbox_id=sid, path=COUNTER,
                                         content=str(int(read["content"]) + 1),
                                         if_match=read["version"])
                if not err:
                    break
                code = wrote["error"]["code"]
                assert code in ("conflict", "locked", "resource_exhausted"), wrote


def _rest_increments(sb: Sandbox) -> None:
    for _ in range(PER):
        while True:
            text, version = sb.files.read_with_version(COUNTER)
            try:
                sb.files.write(COUNTER, str(int(text) + 1), if_match=version)
                break
            except (ConflictError, LockedError, ResourceExhaustedError):
                continue


@pytest.fixture(scope="module")
def shared(gw: Gateway) -> Any:
    """One persistent sandbox of the admin key: every MCP session may use it."""
    sb = Sandbox.create(persistent=True, provider=gw.provider("admin"))
    yield sb
    sb.kill(delete_volume=True)


def test_two_mcp_sessions_and_a_rest_client_keep_every_increment(
        gw: Gateway, shared: Sandbox) -> None:
    shared.files.write(COUNTER, "0")
    rest = threading.Thread(target=_rest_increments, args=(shared,))

    async def race() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_mcp_increments, gw, shared.sandbox_id)
            tg.start_soon(_mcp_increments, gw, shared.sandbox_id)
            await anyio.sleep(1.0)  # the servers start; then the REST client joins in
            rest.start()

    anyio.run(race)
    rest.join(120)
    assert shared.files.read(COUNTER) == str(3 * PER)


def test_a_sessions_lock_dies_with_it_and_names_it_meanwhile(
        gw: Gateway, shared: Sandbox) -> None:
    path = "/workspace/edited.txt"

    async def hold_then_end() -> str:
        async with Client(_params(gw), mode="legacy") as c:
            err, held = await _tool(c, "lock_file", sandbox_id=shared.sandbox_id, path=path,
                                    ttl=600)
            assert not err, held
            with pytest.raises(LockedError) as locked:
                shared.files.write(path, "not now", lock_wait=0.2)
            assert locked.value.details["holder"] == held["holder"]
            assert held["holder"].startswith("admin: MCP session ")
            err, wrote = await _tool(c, "write_file", sandbox_id=shared.sandbox_id,
                                     path=path, content="mine", lock_token=held["token"])
            assert not err, wrote
            return str(held["holder"])

    anyio.run(hold_then_end)
    shared.files.write(path, "the session ended: free", lock_wait=5)


def test_a_killed_clients_lock_lapses_at_its_ttl(gw: Gateway, shared: Sandbox) -> None:
    path = "/workspace/crashed.txt"
    proc = subprocess.Popen([sys.executable, "-m", "agent_sandbox.surfaces.mcp"], cwd=ROOT,
                            env=_env(gw), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        _send(proc, 0, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                      "clientInfo": {"name": "crash", "version": "1"}})
        _recv(proc)
        assert proc.stdin is not None
        proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        _send(proc, 1, "tools/call", {"name": "lock_file", "arguments": {
            "sandbox_id": shared.sandbox_id, "path": path, "ttl": 2}})
        reply = _recv(proc)
        assert not reply["result"].get("isError"), reply
    finally:
        proc.kill()  # no goodbye: the session never ends properly
        proc.wait(10)
    with pytest.raises(LockedError):
        shared.files.write(path, "too early", lock_wait=0)
    t0 = time.monotonic()
    shared.files.write(path, "after the ttl", lock_wait=10)
    assert time.monotonic() - t0 < 10


def _send(proc: subprocess.Popen[bytes], msg_id: int, method: str,
          params: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method,
                                 "params": params}).encode() + b"\n")
    proc.stdin.flush()


def _recv(proc: subprocess.Popen[bytes], timeout: float = 60) -> dict[str, Any]:
    assert proc.stdout is not None
    fd, buf = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        assert left > 0 and select.select([fd], [], [], left)[0], "no reply from the server"
        chunk = os.read(fd, 1 << 20)
        assert chunk, "the server closed stdout"
        buf += chunk
    return json.loads(buf.split(b"\n", 1)[0])
