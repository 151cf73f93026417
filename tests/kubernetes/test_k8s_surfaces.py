"""The MCP server over STDIO and the gateway's REST API, unchanged, with
``ABX_ENGINE=kubernetes``: sandboxes are Pods of the test cluster."""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import pytest
from gateways import running_gateway
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from agent_sandbox.core.errors import NotFoundError
from agent_sandbox.remote import RemoteProvider

pytestmark = pytest.mark.integration
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pods_of(cluster: Any, sandbox_id: str) -> list[str]:
    pods = cluster.core().list_namespaced_pod(cluster.namespace,
                                              label_selector=f"abx.dev/sandbox={sandbox_id}")
    return [p.metadata.name for p in pods.items if p.metadata.deletion_timestamp is None]


def test_mcp_over_stdio_drives_pods(k8s_cluster: Any) -> None:
    env = {**os.environ, **k8s_cluster.env, "ABX_MCP_AUDIT_LOG": "",
           "ABX_MCP_TEMPLATE": "base", "ABX_POOL_SIZE": "0"}
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "agent_sandbox.surfaces.mcp"], env=env, cwd=ROOT)

    async def body() -> str:
        async with Client(params, mode="legacy") as client:
            made = await client.call_tool("create_sandbox", {})
            assert not made.is_error, made
            sid = (made.structured_content or {})["sandbox"]["sandbox_id"]
            assert _pods_of(k8s_cluster, sid), "no Pod runs the sandbox"
            r = await client.call_tool("run_command", {"command": "echo hi; hostname"})
            assert not r.is_error, r
            assert (r.structured_content or {})["stdout"] == f"hi\n{sid}\n"
            w = await client.call_tool("write_file", {"path": "n.txt", "content": "kept"})
            assert not w.is_error, w
            rd = await client.call_tool("read_file", {"path": "/workspace/n.txt"})
            assert rd.content[0].text == "kept"  # type: ignore[union-attr]
            for tool in ("pause_sandbox", "resume_sandbox", "reset_rootfs"):
                step = await client.call_tool(tool, {})
                assert not step.is_error, (tool, step)
            rd = await client.call_tool("read_file", {"path": "/workspace/n.txt"})
            assert rd.content[0].text == "kept"  # type: ignore[union-attr]
            killed = await client.call_tool("kill_sandbox", {})
            assert not killed.is_error, killed
            return sid

    sid = anyio.run(body)
    assert _pods_of(k8s_cluster, sid) == []


def test_gateway_rest_keeps_two_keys_apart(k8s_cluster: Any) -> None:
    keys = {"a": {"max_sandboxes": 5}, "b": {"max_sandboxes": 5}}
    with running_gateway("abx-k8s-gw-", keys, env=k8s_cluster.env) as (proc, _, tokens):
        a = RemoteProvider(proc.url, tokens["a"], retry_seconds=5)
        b = RemoteProvider(proc.url, tokens["b"], retry_seconds=5)
        info = a.create(template="base")
        sid = info.sandbox_id
        try:
            assert info.owner and _pods_of(k8s_cluster, sid)
            assert a.run(sid, "echo from-a").stdout == "from-a\n"
            a.write_file(sid, "/workspace/secret.txt", b"a's")
            assert sid in {s.sandbox_id for s in a.list()}
            assert sid not in {s.sandbox_id for s in b.list()}
            for attempt in (lambda: b.info(sid), lambda: b.run(sid, "id"),
                            lambda: b.read_file(sid, "/workspace/secret.txt"),
                            lambda: b.kill(sid)):
                with pytest.raises(NotFoundError):
                    attempt()
            assert b"".join(a.read_file(sid, "/workspace/secret.txt")) == b"a's"
        finally:
            a.kill(sid, delete_volume=True)
        assert _pods_of(k8s_cluster, sid) == []
