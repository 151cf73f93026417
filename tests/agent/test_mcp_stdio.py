"""The STDIO MCP server, end to end: the official client and raw bytes over real pipes."""

from __future__ import annotations

import base64
import json
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from _helpers import RawServer, kill_quietly, sandbox_ids, stdio_params, wait_gone
from mcp import Client
from portservers import get

from agent_sandbox.surfaces.mcp.tools import ALL_TOOLS

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
Body = Callable[[Client], Awaitable[Any]]


def with_client(body: Body, mode: str = "legacy", **env: str) -> Any:
    async def main() -> Any:
        async with Client(stdio_params(**env), mode=mode) as client:
            return await body(client)

    return anyio.run(main)


async def call(client: Client, tool: str, **args: Any) -> tuple[bool, dict[str, Any], str]:
    r = await client.call_tool(tool, args)
    text = r.content[0].text if r.content else ""  # type: ignore[union-attr]
    return r.is_error, r.structured_content or {}, text


# ---- the official client, both protocol eras ----------------------------------------------

@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_every_tool_end_to_end(mode: str) -> None:
    async def body(c: Client) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        names = {t.name for t in (await c.list_tools()).tools}
        assert len(names) == len(ALL_TOOLS) and "run_code" in names

        # Lazy default sandbox on first use.
        err, data, text = await call(c, "run_command", command="echo hi; echo oops >&2; exit 3")
        assert not err and data["exit_code"] == 3
        assert data["stdout"] == "hi\n" and data["stderr"] == "oops\n" and "exit code: 3" in text
        default = data["sandbox_id"]
        seen["default"] = default

        err, data, _ = await call(c, "run_command", command="pwd; echo $FOO", workdir="/tmp",
                                  envs={"FOO": "bar"})
        assert data["stdout"] == "/tmp\nbar\n" and data["sandbox_id"] == default

        err, data, text = await call(c, "run_code", code="print(1)")
        assert not err and data["stdout"] == "1\n" and data["sandbox_id"] == default

        # Files: text, relative paths, modes, base64, offset/limit.
        err, data, _ = await call(c, "write_file", path="notes/a.txt", content="héllo wörld",
                                  mode="0600")
        assert not err and data["path"] == "/workspace/notes/a.txt" and data["mode"] == "0600"
        err, data, text = await call(c, "read_file", path="/workspace/notes/a.txt")
        assert text == "héllo wörld" and not data["truncated"]
        err, data, _ = await call(c, "read_file", path="notes/a.txt", offset=7, limit=3)
        assert data["content"] == "wör"[:2] or data["content"].startswith("w")
        err, data, _ = await call(c, "read_file", path="notes/a.txt", offset=2**53 - 1)
        got = (data["content"], data["bytes"], data.get("next_offset"))
        assert not err and got == ("", 0, None)
        blob = bytes(range(256))
        err, data, _ = await call(c, "write_file", path="/workspace/b.bin", mode="755",
                                  content=base64.b64encode(blob).decode(), encoding="base64")
        assert not err and data["bytes"] == 256 and data["mode"] == "0755"
        err, data, _ = await call(c, "read_file", path="/workspace/b.bin", encoding="base64")
        assert base64.b64decode(data["content"]) == blob
        err, data, text = await call(c, "read_file", path="/workspace/b.bin")
        assert err and data["error"]["code"] == "invalid_argument" and "base64" in text
        err, data, text = await call(c, "read_file", path="/workspace/missing.txt")
        assert err and data["error"]["code"] == "not_found"
        err, data, text = await call(c, "list_files", path="/workspace", depth=2)
        paths = {e["path"] for e in data["entries"]}
        assert {"/workspace/notes/a.txt", "/workspace/b.bin"} <= paths and "0755" in text

        # Background processes.
        err, data, _ = await call(c, "run_command", command="echo started; sleep 30",
                                  background=True)
        pid = data["pid"]
        await anyio.sleep(0.3)
        err, data, _ = await call(c, "process_output", pid=pid)
        assert data["running"] and data["stdout"] == "started\n"
        err, data, _ = await call(c, "kill_process", pid=pid)
        assert data["killed"]
        err, data, _ = await call(c, "process_output", pid=pid)
        assert not data["running"]

        # A server inside (network off), reached from here through expose_port.
        await call(c, "run_command", background=True,
                   command="cd /workspace && python3 -m http.server 8000 --bind 127.0.0.1")
        err, data, text = await call(c, "expose_port", port=8000)
        assert not err and data["url"].startswith("http://127.0.0.1:") and data["url"] in text
        url = data["url"] + "/notes/a.txt"
        for _ in range(100):  # the server may still be starting
            status, body = await anyio.to_thread.run_sync(get, url)
            if status == 200:
                break
            await anyio.sleep(0.1)
        assert (status, body) == (200, "héllo wörld".encode())
        err, data, text = await call(c, "expose_port", port=70000)
        assert err and "65535" in text

        # A second sandbox; lifecycle tools without sandbox_id act on the default one.
        err, data, text = await call(c, "create_sandbox", timeout=120, envs={"K": "v"})
        assert not err and not data["default"]
        other = data["sandbox"]["sandbox_id"]
        assert data["sandbox"]["env_names"] == ["K"] and "v" not in json.dumps(data["sandbox"]
                                                                               ["env_names"])
        err, data, text = await call(c, "pause_sandbox")
        assert not err and data["sandbox"]["sandbox_id"] == default
        err, data, text = await call(c, "resume_sandbox")
        assert data["sandbox"]["sandbox_id"] == default and data["sandbox"]["state"] == "running"
        err, data, _ = await call(c, "pause_sandbox", sandbox_id=other)
        assert data["sandbox"]["state"] == "paused"
        err, data, _ = await call(c, "list_sandboxes", state="paused")
        assert [s["sandbox_id"] for s in data["sandboxes"]] == [other]
        err, data, _ = await call(c, "resume_sandbox", sandbox_id=other)
        assert data["sandbox"]["state"] == "running"
        await call(c, "run_command", sandbox_id=other, command="touch /etc/marker /workspace/k")
        err, data, _ = await call(c, "reset_rootfs", sandbox_id=other)
        assert not err
        err, data, _ = await call(c, "run_command", sandbox_id=other,
                                  command="ls /etc/marker /workspace/k")
        assert "/workspace/k" in data["stdout"] and "marker" in data["stderr"]
        err, data, text = await call(c, "list_sandboxes")
        assert {s["sandbox_id"] for s in data["sandboxes"]} == {default, other}
        assert data["default"] == default and f"* {default}" in text
        err, data, _ = await call(c, "kill_sandbox", sandbox_id=other, delete_volumes=True)
        assert data["killed"] and data["volume_deleted"]
        err, data, _ = await call(c, "run_command", sandbox_id=other, command="true")
        assert err and data["error"]["code"] == "not_found"

        # Bad arguments come back as tool errors a model can act on.
        err, data, text = await call(c, "run_command", command="true", bogus=1)
        assert err and data["error"]["code"] == "invalid_argument" and "bogus" in text
        err, data, text = await call(c, "no_such_tool")
        assert err and data["error"]["code"] == "not_found"
        return seen

    seen = with_client(body, mode)
    assert not wait_gone({seen["default"]}), "session end must destroy the default sandbox"


def test_output_budget_and_progress_streaming() -> None:
    async def body(c: Client) -> None:
        err, data, text = await call(c, "run_command",
                                     command="seq 1 3000; echo tail-marker")
        assert data["truncated"] and "characters cut" in text and "tail-marker" in text
        full = data["full_output"]["stdout"]
        assert full.startswith("/tmp/abx-output/") and full in text
        err, data, _ = await call(c, "run_command", command=f"wc -l < {full}")
        assert data["stdout"].strip() == "3001"
        err, data, text = await call(c, "read_file", path=full)
        assert data["truncated"] and data["next_offset"] == 4000

        messages: list[str] = []

        async def progress(p: float, total: float | None, message: str | None) -> None:
            messages.append(message or "")

        r = await c.call_tool("run_command",
                              {"command": "for i in 1 2 3; do echo step$i; sleep 0.3; done"},
                              progress_callback=progress)
        assert not r.is_error
        assert "".join(messages) == "step1\nstep2\nstep3\n" and len(messages) >= 2

    with_client(body, ABX_MCP_OUTPUT_BUDGET="4000")


def test_sessions_are_isolated_and_cleaned_up_on_eof() -> None:
    async def main() -> tuple[str, str]:
        async with Client(stdio_params(), mode="legacy") as a, \
                Client(stdio_params(), mode="auto") as b:
            _, data, _ = await call(a, "run_command", command="true")
            mine = data["sandbox_id"]
            _, data, _ = await call(a, "create_sandbox", persistent=True)
            kept = data["sandbox"]["sandbox_id"]
            # B sees neither A's default sandbox nor can it use it...
            err, data, _ = await call(b, "list_sandboxes")
            visible = {s["sandbox_id"] for s in data["sandboxes"]}
            assert mine not in visible and kept in visible  # ...but persistent ones are shared
            for tool, args in [("run_command", {"command": "id"}), ("read_file", {"path": "/x"}),
                               ("kill_sandbox", {}), ("pause_sandbox", {})]:
                err, data, _ = await call(b, tool, sandbox_id=mine, **args)
                assert err and data["error"]["code"] == "not_found", tool
            err, data, _ = await call(b, "run_command", sandbox_id=kept, command="echo ok")
            assert data["stdout"] == "ok\n"
            assert mine in sandbox_ids()
            return mine, kept

    mine, kept = anyio.run(main)
    try:
        assert not wait_gone({mine}), "non-persistent sandbox survived its session"
        assert kept in sandbox_ids(), "a persistent sandbox must outlive the session"
    finally:
        kill_quietly(kept)


def test_capability_gating_read_only() -> None:
    async def body(c: Client) -> None:
        names = sorted(t.name for t in (await c.list_tools()).tools)
        assert names == ["list_files", "list_sandboxes", "list_templates", "process_output",
                         "read_file"]
        for tool in ("run_command", "write_file", "create_sandbox"):
            err, data, _ = await call(c, tool, command="true", path="/x", content="")
            assert err and data["error"]["code"] == "not_found"

    with_client(body, ABX_MCP_TOOLS="read-only")


def test_busy_error_carries_retry_after_and_audit_log(tmp_path: Any) -> None:
    audit = tmp_path / "audit.log"

    async def body(c: Client) -> None:
        await call(c, "run_command", command="true")  # create the default sandbox first
        results: list[tuple[bool, dict[str, Any], str]] = []

        async def slow() -> None:
            results.append(await call(c, "run_command", command="sleep 1.5",
                                      envs={"SECRET": "hunter2-value"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await anyio.sleep(0.5)
            err, data, text = await call(c, "list_sandboxes")
            assert err and data["error"]["code"] == "resource_exhausted"
            assert data["error"]["retry_after"] > 0 and "busy" in text
        assert not results[0][0], results[0]

    with_client(body, ABX_MCP_MAX_CONCURRENCY="1", ABX_MCP_AUDIT_LOG=str(audit))
    assert oct(audit.stat().st_mode & 0o777) == "0o600"
    raw = audit.read_text()
    assert "hunter2" not in raw and "SECRET" not in raw and "sleep" not in raw
    lines = [json.loads(line) for line in raw.splitlines()]
    assert [e["tool"] for e in lines] == ["run_command", "list_sandboxes", "run_command"]
    busy = lines[1]
    assert busy["status"] == "busy" and busy["error_code"] == "resource_exhausted"
    for e in lines:
        assert {"time", "trace_id", "session_id", "transport", "tool", "sandbox_id", "status",
                "duration_ms", "error_code", "input_bytes", "output_bytes"} <= set(e)
        assert e["transport"] == "stdio"
    assert lines[0]["sandbox_id"] and lines[2]["duration_ms"] >= 1000


# ---- raw bytes on the wire ----------------------------------------------------------------

def test_seed_smoke_two_json_lines() -> None:
    srv = RawServer()
    try:
        srv.send_bytes(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n'
                       b'{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}\n')
        first, second = srv.recv(), srv.recv()
        assert first["id"] == 1 and first["result"]["protocolVersion"] == "2024-11-05"
        assert first["result"]["serverInfo"]["name"] == "agent-sandbox"
        assert second["id"] == 2 and len(second["result"]["tools"]) == len(ALL_TOOLS)
    finally:
        assert srv.close() == 0


@pytest.mark.parametrize("asked, answered", [("2025-06-18", "2025-06-18"),
                                             ("2024-11-05", "2024-11-05"),
                                             ("1999-01-01", "2024-11-05")])
def test_protocol_version_negotiation(asked: str, answered: str) -> None:
    srv = RawServer()
    try:
        assert srv.initialize(asked)["result"]["protocolVersion"] == answered
    finally:
        srv.close()


def test_framing_parse_errors_size_limit_and_notifications() -> None:
    srv = RawServer()
    try:
        srv.initialize()
        srv.send_bytes(b"{not json\n")
        reply = srv.recv()
        assert reply["error"]["code"] == -32700 and reply["id"] is None
        srv.send_bytes(b'["batch"]\n')  # a batch: one error per element, in an array
        [reply] = srv.recv()
        assert reply["error"]["code"] == -32600 and reply["id"] is None

        def ping(msg_id: int, size: int) -> bytes:
            head = b'{"jsonrpc":"2.0","id":%d,"method":"ping","params":{"_meta":{"pad":"' % msg_id
            tail = b'"}}}'
            return head + b"a" * (size - len(head) - len(tail)) + tail

        under = ping(3, 8 * MIB)
        assert len(under) == 8 * MIB
        srv.send_bytes(under + b"\n")
        assert srv.recv() == {"jsonrpc": "2.0", "id": 3, "result": {}}
        srv.send_bytes(ping(4, 8 * MIB + 1) + b"\n")
        reply = srv.recv()
        assert reply["id"] == 4 and reply["error"]["code"] == -32600
        assert "larger than" in reply["error"]["message"]
        # A notification gets no reply: the next line out answers the next request.
        srv.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": 99}})
        srv.request(5, "ping")
        assert srv.recv() == {"jsonrpc": "2.0", "id": 5, "result": {}}
    finally:
        assert srv.close() == 0


def test_ping_answered_during_long_call() -> None:
    srv = RawServer()
    try:
        srv.initialize()
        srv.request(9, "ping")  # initialize is answered before the SDK is loaded: wait for it
        assert srv.recv()["id"] == 9
        srv.request(10, "tools/call", {"name": "run_command",
                                       "arguments": {"command": "sleep 4"}})
        srv.request(11, "ping")
        first = srv.recv()  # the order is the proof: not a stopwatch on a loaded host
        assert first["id"] == 11, first
        second = srv.recv()
        assert second["id"] == 10 and not second["result"].get("isError")
    finally:
        srv.close()


def test_sigterm_destroys_session_sandboxes() -> None:
    srv = RawServer()
    try:
        srv.initialize()
        srv.request(1, "tools/call", {"name": "run_command", "arguments": {"command": "true"}})
        sid = srv.recv()["result"]["structuredContent"]["sandbox_id"]
        assert sid in sandbox_ids()
        os.kill(srv.proc.pid, signal.SIGTERM)
        assert srv.proc.wait(20) == 0
        assert not wait_gone({sid})
    finally:
        srv.close()


# ---- the documented smoke tests, piped, and what a client may leave out --------------------

def _piped(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Write every line at once, close stdin (EOF), read every answer."""
    import subprocess
    import sys

    from _helpers import ROOT, server_env

    data = "".join(json.dumps(m) + "\n" for m in lines).encode()
    out = subprocess.run([sys.executable, "-m", "agent_sandbox.surfaces.mcp"], input=data,
                         capture_output=True, cwd=ROOT, env=server_env(), timeout=120).stdout
    return [json.loads(line) for line in out.splitlines()]


INIT_BARE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}


@pytest.mark.parametrize("notify", [True, False])
def test_piped_smoke_test_answers_every_request_before_eof(notify: bool) -> None:
    answers = _piped([INIT_BARE, *([INITIALIZED] if notify else []), LIST])
    assert [a["id"] for a in answers] == [1, 2], answers
    assert len(answers[1]["result"]["tools"]) == len(ALL_TOOLS)


def test_piped_tool_call_is_answered_and_its_sandbox_removed() -> None:
    before = sandbox_ids()
    answers = _piped([INIT_BARE, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "run_command", "arguments": {"command": "sleep 1; echo piped"}}}])
    assert answers[1]["id"] == 2 and "error" not in answers[1], answers[1]
    assert answers[1]["result"]["structuredContent"]["stdout"] == "piped\n"
    assert answers[1]["result"]["structuredContent"]["sandbox_id"] not in sandbox_ids() - before


def test_cancelled_command_is_stopped_inside_the_sandbox() -> None:
    srv = RawServer()
    try:
        srv.initialize()
        srv.request(1, "tools/call", {"name": "run_command", "arguments": {
            "command": "echo $$ > /workspace/pid; exec sleep 30"}})
        srv.request(2, "tools/call", {"name": "run_command", "arguments": {
            "command": "for i in $(seq 100); do [ -s /workspace/pid ] && break; sleep 0.05; "
                       "done; cat /workspace/pid"}})
        pid = srv.recv()["result"]["structuredContent"]["stdout"].strip()
        assert pid.isdigit()
        srv.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": 1, "reason": "user pressed stop"}})
        # The command is gone at once (well before its 30 s), and request 1 is never answered.
        srv.request(3, "tools/call", {"name": "run_command", "arguments": {
            "command": f"for i in $(seq 100); do kill -0 {pid} 2>/dev/null || exit 0; "
                       "sleep 0.05; done; exit 1"}})
        reply = srv.recv()
        assert reply["id"] == 3 and reply["result"]["structuredContent"]["exit_code"] == 0, \
            "the cancelled command was still running 5 s later"
    finally:
        srv.close()


def test_lifecycle_tools_default_to_the_session_sandbox() -> None:
    async def body(c: Client) -> None:
        err, data, text = await call(c, "kill_sandbox")
        assert err and data["error"]["code"] == "not_found" and "no default sandbox" in text
        err, data, _ = await call(c, "run_command", command="echo 1 > /workspace/f")
        first = data["sandbox_id"]
        for tool, state in (("pause_sandbox", "paused"), ("resume_sandbox", "running"),
                            ("reset_rootfs", "running")):
            err, data, _ = await call(c, tool)
            assert not err and data["sandbox"]["sandbox_id"] == first, (tool, data)
            assert data["sandbox"]["state"] == state
        err, data, _ = await call(c, "kill_sandbox", delete_volumes=True)
        assert not err and data == {"sandbox_id": first, "killed": True, "volume_deleted": True}
        assert first not in sandbox_ids()
        err, data, _ = await call(c, "run_command", command="true")
        assert not err and data["sandbox_id"] != first  # a new default

    with_client(body)


def test_snapshot_sandbox_and_a_copy_from_it() -> None:
    from snapshotting import memory_snapshots_missing

    from agent_sandbox.providers.local import local_provider

    if (why := memory_snapshots_missing(local_provider())) is not None:
        pytest.skip(why)

    async def body(c: Client) -> None:
        err, data, _ = await call(c, "run_command", command="echo kept > /workspace/f")
        first = data["sandbox_id"]
        err, data, text = await call(c, "snapshot_sandbox", name="one")
        assert not err, text
        snap = data["snapshot"]
        assert (snap["sandbox_id"], snap["name"]) == (first, "one"), snap
        err, data, text = await call(c, "create_sandbox", snapshot=snap["snapshot_id"])
        assert not err, text
        copy = data["sandbox"]["sandbox_id"]
        err, data, _ = await call(c, "run_command", command="cat /workspace/f",
                                  sandbox_id=copy)
        assert data["stdout"] == "kept\n"
        local_provider().delete_snapshot(snap["snapshot_id"])

    with_client(body)
