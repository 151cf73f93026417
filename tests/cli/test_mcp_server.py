"""``abx mcp start|stop|status``: a real background HTTP server, and STDIO through a pipe."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import httpx2 as httpx
import pytest
from conftest import ABX, Abx
from mcpwire import ACCEPT, INIT, rpc_body

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_sandbox_over_mcp(url: str, headers: dict[str, str]) -> str:
    r = httpx.post(url, json=INIT, headers={**ACCEPT, **headers}, timeout=30)
    assert r.status_code == 200, r.text
    session = {**ACCEPT, **headers, "Mcp-Session-Id": r.headers["mcp-session-id"]}
    httpx.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
               headers=session, timeout=30)
    r = httpx.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                              "params": {"name": "create_sandbox", "arguments": {}}},
                   headers=session, timeout=120)
    result = rpc_body(r)["result"]
    assert not result.get("isError"), result
    return result["structuredContent"]["sandbox"]["sandbox_id"]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_background_http_start_status_stop(abx: Abx) -> None:
    port = free_port()
    # --template base: the server's default template may need a long first build.
    r = abx("mcp", "start", "--http", "--background", "--port", str(port), "--template", "base")
    pid = int(re.search(r"pid (\d+)", r.out).group(1))
    url = f"http://127.0.0.1:{port}/mcp"
    log = abx.home / ".abx" / "run" / "mcp-server.log"
    assert url in r.out and str(log) in r.out
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        status = abx("mcp", "status", "--json").json()
        assert status["mcp_running"] is True and status["transport"] == "http"
        assert status["pid"] == pid and status["url"] == url
        record = abx.home / ".abx" / "run" / "mcp-server.json"
        before = record.read_bytes()
        # A second start says so, and leaves the record alone.
        again = abx("mcp", "start", "--http", "--background", "--port", str(free_port()),
                    check=1)
        assert "already running" in again.err and str(pid) in again.err
        assert record.read_bytes() == before
        sandbox_id = create_sandbox_over_mcp(url, {})
    finally:
        stopped = abx("mcp", "stop", "--json").json()
    assert stopped == {"stopped": True, "pid": pid, "transport": "http"}
    assert not alive(pid)
    assert not (abx.home / ".abx" / "run" / "mcp-server.json").exists()
    assert abx("mcp", "status", "--json").json()["mcp_running"] is False
    from agent_sandbox.providers.local import local_provider

    assert sandbox_id not in {s.sandbox_id for s in local_provider().list()}
    assert "Nothing to stop" in abx("mcp", "stop").out


def test_generated_token_reaches_the_server_by_env_only(abx: Abx) -> None:
    port = free_port()
    r = abx("mcp", "start", "--http", "--background", "--port", str(port), "--generate-token",
            "--json", env={"ABX_SANDBOX_API_KEY": "sk-secret-in-env-only"})
    info = r.json()
    token = (abx.home / ".abx" / "run" / "mcp-token").read_text().strip()
    try:
        assert token and token not in r.out and token not in r.err
        assert oct((abx.home / ".abx/run/mcp-token").stat().st_mode & 0o777) == "0o600"
        health = f"http://127.0.0.1:{port}/health"
        assert httpx.get(health, timeout=5).status_code == 401
        assert httpx.get(health, headers={"Authorization": f"Bearer {token}"},
                         timeout=5).status_code == 200
        cmdline = Path(f"/proc/{info['pid']}/cmdline").read_bytes()
        assert token.encode() not in cmdline and b"sk-secret" not in cmdline
        environ = Path(f"/proc/{info['pid']}/environ").read_bytes()
        assert f"ABX_MCP_AUTH_TOKEN={token}".encode() in environ.split(b"\0")
        assert b"ABX_SANDBOX_API_KEY=sk-secret-in-env-only" in environ.split(b"\0")
        assert abx("mcp", "status", "--json").json()["auth_configured"] is True
    finally:
        abx("mcp", "stop")


def test_refusals(abx: Abx) -> None:
    r = abx("mcp", "start", "--http", "--host", "0.0.0.0", "--background", check=2)
    assert "without a bearer token" in r.err
    assert "--http" in abx("mcp", "start", "--background", check=2).err
    abx("mcp", "start", "--http", "--port", "70000", check=2)
    assert "unknown tool" in abx("mcp", "start", "--tools", "rm_rf", check=2).err
    empty = abx.cwd / "empty-token"
    empty.write_text("\n")
    assert "is empty" in abx("mcp", "start", "--http", "--auth-token-file", str(empty),
                             check=2).err


def test_stop_never_signals_a_process_that_is_not_our_server(abx: Abx) -> None:
    run = abx.home / ".abx" / "run"
    run.mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (run / "mcp-server.json").write_text(json.dumps({"pid": sleeper.pid,
                                                         "transport": "http"}))
        assert abx("mcp", "status", "--json").json()["mcp_running"] is False
        r = abx("mcp", "stop", "--json").json()
        assert r["stopped"] is False and "stale" in r["reason"]
        assert sleeper.poll() is None  # untouched
        assert not (run / "mcp-server.json").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_runtime_dir_override(abx: Abx, tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    env = {"ABX_MCP_RUNTIME_DIR": str(runtime)}
    info = abx("mcp", "start", "--http", "--background", "--port", str(free_port()), "--json",
               env=env).json()
    try:
        assert info["log"] == str(runtime / "mcp-server.log")
        assert (runtime / "mcp-server.json").exists()
    finally:
        abx("mcp", "stop", env=env)
    assert not (runtime / "mcp-server.json").exists()


def test_stdio_start_answers_on_stdout(abx: Abx) -> None:
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}]
    data = "".join(json.dumps(m) + "\n" for m in lines)
    proc = subprocess.Popen([str(ABX), "mcp", "start", "--tools", "read-only"], cwd=abx.cwd,
                            env=abx.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(data, timeout=60)
    replies = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in replies] == [1, 2]
    names = {t["name"] for t in replies[1]["result"]["tools"]}
    assert names == {"list_sandboxes", "list_templates", "read_file", "list_files",
                     "process_output"}
    assert "agent-sandbox MCP server (stdio)" in err
    assert proc.returncode == 0
    assert abx("mcp", "status", "--json").json()["mcp_running"] is False
