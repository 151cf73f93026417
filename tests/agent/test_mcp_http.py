"""The Streamable HTTP MCP server, run by uvicorn as a real subprocess on loopback."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from _helpers import ROOT, Uvicorn, server_env, wait_gone
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcpwire import ACCEPT, INIT, rpc_body, rpc_text

from agent_sandbox.surfaces.mcp.tools import ALL_TOOLS

pytestmark = pytest.mark.integration

TOKEN = "t0ken-for-tests"


@pytest.fixture(scope="module")
def srv() -> Iterator[Uvicorn]:
    server = Uvicorn(ABX_MCP_AUTH_TOKEN=TOKEN, ABX_MCP_ALLOWED_ORIGINS="https://app.example")
    yield server
    server.stop()


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def open_session(base: str, headers: dict[str, str]) -> str:
    r = httpx.post(base + "/mcp", json=INIT, headers={**ACCEPT, **headers})
    assert r.status_code == 200, r.text
    sid = r.headers["mcp-session-id"]
    httpx.post(base + "/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
               headers={**ACCEPT, **headers, "Mcp-Session-Id": sid})
    return sid


def call_tool(base: str, headers: dict[str, str], sid: str, name: str,
              args: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(base + "/mcp", headers={**ACCEPT, **headers, "Mcp-Session-Id": sid},
                   json={"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                         "params": {"name": name, "arguments": args}}, timeout=60)
    assert r.status_code == 200, r.text
    return rpc_body(r)["result"]


def test_statuses(srv: Uvicorn) -> None:
    u = srv.url
    assert httpx.get(u + "/health").status_code == 401
    assert httpx.get(u + "/health", headers=auth("wrong")).status_code == 401
    # Auth failures say what is wrong, and nothing invites an OAuth flow.
    for headers, says in (({}, "missing bearer token"), (auth("wrong"), "wrong bearer token"),
                          ({"Authorization": "Basic x"}, "must be 'Bearer <token>'")):
        r = httpx.post(u + "/mcp", json=INIT, headers={**ACCEPT, **headers})
        assert r.status_code == 401 and says in r.json()["error"]["message"], r.text
        assert "resource_metadata" not in r.headers["www-authenticate"]
        assert "ABX_MCP_AUTH_TOKEN" in r.json()["error"]["message"] or "Basic" in str(headers)
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-"
                 "resource/mcp", "/.well-known/oauth-authorization-server", "/register"):
        r = httpx.get(u + path)
        assert r.status_code == 404 and "does not use OAuth" in r.json()["error"], path
    health = httpx.get(u + "/health", headers=auth())
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["protocol"] == "2025-06-18"
    assert httpx.post(u + "/mcp", json=INIT, headers=ACCEPT).status_code == 401
    evil = {**ACCEPT, **auth(), "Origin": "http://evil.example"}
    assert httpx.post(u + "/mcp", json=INIT, headers=evil).status_code == 403
    for ok_origin in ("https://app.example", "http://localhost:3000"):
        r = httpx.post(u + "/mcp", json=INIT, headers={**ACCEPT, **auth(), "Origin": ok_origin})
        assert r.status_code == 200
        httpx.delete(u + "/mcp", headers={**auth(), "Mcp-Session-Id": r.headers["mcp-session-id"]})
    assert httpx.get(u + "/mcp", headers=auth()).status_code == 405
    assert httpx.get(u + "/nope", headers=auth()).status_code == 404
    unknown = {**ACCEPT, **auth(), "Mcp-Session-Id": "no-such-session"}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert httpx.post(u + "/mcp", json=listing, headers=unknown).status_code == 404
    assert httpx.post(u + "/mcp", json=listing, headers={**ACCEPT, **auth()}).status_code == 400


def test_official_client_sessions_isolation_and_delete(srv: Uvicorn) -> None:
    async def main() -> tuple[str, dict[str, Any]]:
        async with contextlib.AsyncExitStack() as stack:
            h1 = await stack.enter_async_context(httpx.AsyncClient(headers=auth(), timeout=60))
            h2 = await stack.enter_async_context(httpx.AsyncClient(headers=auth(), timeout=60))
            a = await stack.enter_async_context(Client(
                streamable_http_client(srv.url + "/mcp", http_client=h1), mode="legacy"))
            b = await stack.enter_async_context(Client(
                streamable_http_client(srv.url + "/mcp", http_client=h2), mode="legacy"))
            if True:
                tools = {t.name for t in (await a.list_tools()).tools}
                assert "run_command" in tools and len(tools) == len(ALL_TOOLS)
                r = await a.call_tool("run_command", {"command": "echo $((6*7))"})
                assert not r.is_error and r.structured_content["stdout"] == "42\n"
                mine = r.structured_content["sandbox_id"]
                r = await b.call_tool("run_command", {"command": "true", "sandbox_id": mine})
                assert r.is_error and r.structured_content["error"]["code"] == "not_found"
                r = await b.call_tool("run_command", {"command": "true", "sandbox_id": "sb-1"})
                assert r.is_error and "invalid sandbox id 'sb-1'" in r.content[0].text
                assert "list_sandboxes shows" in r.content[0].text  # the tool, not a command
                r = await b.call_tool("list_sandboxes", {})
                assert mine not in {s["sandbox_id"] for s in r.structured_content["sandboxes"]}
                health = httpx.get(srv.url + "/health", headers=auth()).json()
                return mine, health

    mine, health = anyio.run(main)
    assert health["sessions"] >= 2 and health["sandboxes"] >= 1
    assert health["last_tool"]["name"] == "list_sandboxes"
    # Closing the client sends DELETE: the session's sandbox goes with it.
    assert not wait_gone({mine})


def test_auto_mode_client(srv: Uvicorn) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(headers=auth(), timeout=60) as h, \
                Client(streamable_http_client(srv.url + "/mcp", http_client=h)) as c:
            # Over HTTP the server is sessionful: an auto client falls back to a handshake
            # version (and so gets a session of its own).
            assert c.protocol_version <= "2025-11-25", c.protocol_version
            # The HTTP default template is base; a first run_code still gets a kernel.
            r = await c.call_tool("run_code", {"code": "1+1"})
            assert not r.is_error and r.structured_content["results"][0]["text"] == "2"
            r = await c.call_tool("run_command", {"command": "echo auto"})
            assert not r.is_error and r.structured_content["stdout"] == "auto\n"
            r = await c.call_tool("create_sandbox", {})
            assert r.structured_content["sandbox"]["template"] == "base"
            plain = r.structured_content["sandbox"]["sandbox_id"]
            r = await c.call_tool("run_code", {"code": "1", "sandbox_id": plain})
            assert r.is_error and "code-interpreter-v1" in r.content[0].text

    anyio.run(main)


def test_idle_expiry_session_cap_and_loopback_warning() -> None:
    server = Uvicorn(ABX_MCP_SESSION_TTL="2", ABX_MCP_MAX_SESSIONS="1")
    try:
        sid = open_session(server.url, {})
        result = call_tool(server.url, {}, sid, "run_command", {"command": "true"})
        sandbox = result["structuredContent"]["sandbox_id"]
        # The only session holds a sandbox: it is not evicted, and the refusal says why.
        r = httpx.post(server.url + "/mcp", json=INIT, headers=ACCEPT)
        assert r.status_code == 503 and r.headers["retry-after"]
        assert "too many open MCP sessions (1)" in r.json()["error"]["message"]
        assert not wait_gone({sandbox}, timeout=12), "idle expiry must destroy the sandbox"
        assert httpx.get(server.url + "/health").json()["sessions"] == 0
        # Room again once the SDK has let go of the session too (just after our cleanup
        # returns; on a loaded machine that can be a moment after the sandbox is gone).
        deadline = time.monotonic() + 10
        while (r := httpx.post(server.url + "/mcp", json=INIT, headers=ACCEPT)).status_code \
                == 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert r.status_code == 200
    finally:
        err = server.stop()
    assert "ABX_MCP_AUTH_TOKEN is not set" in err


def test_sessions_that_made_nothing_make_room_at_the_cap() -> None:
    """Health checks that never DELETE must not lock everyone out until the TTL."""
    server = Uvicorn(ABX_MCP_MAX_SESSIONS="3")
    try:
        busy = open_session(server.url, {})
        sandbox = call_tool(server.url, {}, busy, "run_command",
                            {"command": "true"})["structuredContent"]["sandbox_id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        idle = []
        for _ in range(6):  # twice the cap of list-and-leave clients
            sid = open_session(server.url, {})
            r = httpx.post(server.url + "/mcp", json=listing,
                           headers={**ACCEPT, "Mcp-Session-Id": sid})
            assert r.status_code == 200 and len(rpc_body(r)["result"]["tools"]) == len(ALL_TOOLS)
            idle.append(sid)
        # The oldest empty sessions were ended; the one holding a sandbox never is.
        gone = httpx.post(server.url + "/mcp", json=listing,
                          headers={**ACCEPT, "Mcp-Session-Id": idle[0]})
        assert gone.status_code == 404
        again = call_tool(server.url, {}, busy, "run_command", {"command": "echo still"})
        assert again["structuredContent"]["stdout"] == "still\n"
        assert again["structuredContent"]["sandbox_id"] == sandbox
        assert httpx.get(server.url + "/health").json()["sessions"] <= 3
    finally:
        server.stop()


def test_documented_curl_flow_verbatim() -> None:
    """docs/mcp.md's three curl steps: no Accept header, no notifications/initialized,
    initialize with empty params."""
    server = Uvicorn(ABX_MCP_AUTH_TOKEN="replace_me")
    try:
        url = server.url + "/mcp"
        plain = {"Content-Type": "application/json", "Authorization": "Bearer replace_me"}
        r = httpx.post(url, headers=plain, content='{"jsonrpc":"2.0","id":1,"method":'
                       '"initialize","params":{}}')
        assert r.status_code == 200 and "result" in rpc_body(r), r.text
        sid = r.headers["mcp-session-id"]
        r = httpx.post(url, headers={**plain, "Mcp-Session-Id": sid}, timeout=120, content=(
            '{"jsonrpc":"2.0","id":2,"method":"tools/call",\n'
            '       "params":{"name":"run_code","arguments":{"code":"print(1+1)"}}}'))
        result = rpc_body(r)["result"]
        assert not result["isError"] and result["structuredContent"]["stdout"] == "2\n"
        sandbox = result["structuredContent"]["sandbox_id"]
        r = httpx.request("DELETE", url, headers={"Authorization": "Bearer replace_me",
                                                  "Mcp-Session-Id": sid})
        assert r.status_code < 300
        assert not wait_gone({sandbox}), "DELETE must destroy the session's sandbox"
    finally:
        server.stop()


def test_empty_token_fails_closed() -> None:
    server = Uvicorn(ABX_MCP_AUTH_TOKEN="")
    try:
        assert httpx.get(server.url + "/health").status_code == 401
        assert httpx.get(server.url + "/health", headers=auth("x")).status_code == 401
        assert httpx.post(server.url + "/mcp", json=INIT, headers={**ACCEPT, **auth(TOKEN)}
                          ).status_code == 401
    finally:
        server.stop()


def test_sessionless_requests_are_refused(srv: Uvicorn) -> None:
    """A raw modern-era request with no session cannot reach any sandbox."""
    headers = {**auth(), "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json", "MCP-Protocol-Version": "2026-07-28"}
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"}}
    for method, params in (("server/discover", {}),
                           ("tools/call", {"name": "run_command",
                                           "arguments": {"command": "echo leaked"}})):
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
        routing = {"Mcp-Method": method}
        if method == "tools/call":
            routing["Mcp-Name"] = params["name"]
        r = httpx.post(srv.url + "/mcp", json=body, headers={**headers, **routing}, timeout=30)
        assert "error" in r.text and "handshake" in r.text, (method, r.text)
        assert "leaked" not in r.text


def test_refuses_to_start_beyond_loopback_without_token() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "uvicorn", "agent_sandbox.surfaces.mcp.http_app:asgi_app",
         "--host", "0.0.0.0", "--port", "0"], cwd=ROOT, env=server_env(),
        capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "refusing to serve on 0.0.0.0 without a token" in proc.stderr
    # With a token the same bind is allowed, and the token is required.
    server = Uvicorn(host="0.0.0.0", ABX_MCP_AUTH_TOKEN=TOKEN)
    try:
        assert httpx.get(server.url + "/health").status_code == 401
        assert httpx.get(server.url + "/health", headers=auth()).status_code == 200
    finally:
        server.stop()


def test_curl_flow(srv: Uvicorn) -> None:
    """initialize -> tools/call run_code with the session header -> DELETE, with real curl."""
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")

    def post(body: dict[str, Any], *extra: str) -> tuple[dict[str, str], str]:
        argv = [curl, "-sS", "-D", "-", "-X", "POST", srv.url + "/mcp",
                "-H", "Content-Type: application/json",
                "-H", "Accept: application/json, text/event-stream",
                "-H", f"Authorization: Bearer {TOKEN}", *extra, "--data", json.dumps(body)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout
        head, _, payload = out.replace("\r\n", "\n").partition("\n\n")
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in head.splitlines()[1:])}
        headers["status"] = head.split()[1]
        return headers, payload

    headers, payload = post(INIT)
    assert headers["status"] == "200"
    sid = headers["mcp-session-id"]
    assert rpc_text(payload, headers["content-type"])["result"]["protocolVersion"] == "2025-06-18"
    session = ("-H", f"Mcp-Session-Id: {sid}")
    headers, _ = post({"jsonrpc": "2.0", "method": "notifications/initialized"}, *session)
    assert headers["status"] == "202"
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "run_code", "arguments": {"code": "print(1+1)"}}}
    headers, payload = post(call, *session)
    result = rpc_text(payload, headers["content-type"])["result"]
    assert not result.get("isError"), result
    assert result["structuredContent"]["stdout"] == "2\n"
    sandbox = result["structuredContent"]["sandbox_id"]
    done = subprocess.run([curl, "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "DELETE",
                           srv.url + "/mcp", "-H", f"Authorization: Bearer {TOKEN}", *session],
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "200"
    assert not wait_gone({sandbox}), "DELETE must destroy the session's sandbox"
    headers, _ = post(call, *session)
    assert headers["status"] == "404"
