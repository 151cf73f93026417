"""The MCP server, unchanged, driving sandboxes through the gateway."""

from __future__ import annotations

import base64
import os
import sys
from typing import Any

import anyio
import pytest
from _gw import Gateway
from mcp import Client
from mcp.client.stdio import StdioServerParameters

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The MCP server's default template is code-interpreter-v1: built before the first call.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("code_template")]


def _params(gw: Gateway, who: str) -> StdioServerParameters:
    env = {**os.environ, "ABX_MCP_AUDIT_LOG": "", "ABX_SANDBOX_BASE_URL": gw.url,
           "ABX_SANDBOX_API_KEY": gw.tokens[who]}
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "agent_sandbox.surfaces.mcp"], env=env, cwd=ROOT)


def test_mcp_server_with_a_base_url(gw: Gateway) -> None:
    async def body() -> dict[str, Any]:
        async with Client(_params(gw, "b"), mode="legacy") as client:
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
            # Through a gateway, expose_port also gives a link a person's browser can open.
            ex = await client.call_tool("expose_port", {"port": 8000})
            shown = ex.structured_content or {}
            assert not ex.is_error and "/share/" in shown["share_url"], ex
            assert shown["url"].endswith(f"/v1/sandboxes/{sid}/ports/8000")
            return data

    data = anyio.run(body)
    assert data["exit_code"] == 0
    assert data["stdout"] == f"via-gateway\n{data['sandbox_id']}\n"


def test_mcp_run_code_through_the_gateway(gw: Gateway) -> None:
    async def body() -> None:
        async with Client(_params(gw, "a"), mode="legacy") as client:
            r = await client.call_tool("run_code", {"code": "print(1+1)"})
            assert not r.is_error, r
            data: dict[str, Any] = r.structured_content or {}
            assert data["stdout"] == "2\n" and "error" not in data  # no exception: left out
            sid = data["sandbox_id"]
            assert sid in {s.sandbox_id for s in gw.provider("a").list()}

            r = await client.call_tool("run_code", {"code": "import matplotlib.pyplot as plt\n"
                                                    "plt.plot([1, 2, 3])\nplt.show()"})
            assert not r.is_error, r
            images = [p for p in r.content if p.type == "image"]
            assert len(images) == 1 and images[0].mime_type == "image/png"  # type: ignore
            png = base64.b64decode(images[0].data)  # type: ignore[union-attr]
            assert png.startswith(PNG_SIGNATURE) and len(png) > 1000

            r = await client.call_tool("run_code", {"code": "1/0"})
            assert not r.is_error  # the code failed, not the tool
            assert (r.structured_content or {})["error"]["name"] == "ZeroDivisionError"
            await client.call_tool("kill_sandbox", {"sandbox_id": sid})

    anyio.run(body)
