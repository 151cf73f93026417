"""The MCP server, unchanged, driving sandboxes through the gateway."""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
from _gw import Gateway
from mcp import Client
from mcp.client.stdio import StdioServerParameters

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_mcp_server_with_a_base_url(gw: Gateway) -> None:
    env = {**os.environ, "ABX_MCP_AUDIT_LOG": "", "ABX_SANDBOX_BASE_URL": gw.url,
           "ABX_SANDBOX_API_KEY": gw.tokens["b"]}
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "agent_sandbox.agent.mcp"], env=env, cwd=ROOT)

    async def body() -> dict[str, Any]:
        async with Client(params, mode="legacy") as client:
            r = await client.call_tool("run_command", {"command": "echo via-gateway; hostname"})
            assert not r.is_error, r
            data = r.structured_content or {}
            sid = data["sandbox_id"]
            # The sandbox is key B's: the gateway made it, and only B sees it.
            assert sid in {s.sandbox_id for s in gw.provider("b").list()}
            assert sid not in {s.sandbox_id for s in gw.provider("a").list()}
            w = await client.call_tool("write_file", {"path": "n.txt", "content": "hi"})
            assert not w.is_error
            rd = await client.call_tool("read_file", {"path": "/workspace/n.txt"})
            assert rd.content[0].text == "hi"  # type: ignore[union-attr]
            return data

    data = anyio.run(body)
    assert data["exit_code"] == 0
    assert data["stdout"] == f"via-gateway\n{data['sandbox_id']}\n"
