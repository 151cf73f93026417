"""Hostile input against the real MCP server, over STDIO pipes and over HTTP.

Every request with a valid id is answered (bad ones with the JSON-RPC error the corpus
expects), the process survives every message, no answer carries a traceback or an
"internal error", and a normal tool call works afterwards. See _fuzz_corpus.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from _fuzz_corpus import INVALID, PARAMS, Case, build
from _helpers import RawServer, Uvicorn
from mcpwire import ACCEPT, INIT

from agent_sandbox.surfaces.mcp.tools import ALL_TOOLS

pytestmark = pytest.mark.integration

LEAKS = ("Traceback", 'File "', "internal error", "Internal error")
BASE = {"ABX_MCP_TEMPLATE": "base"}  # default sandboxes in ~0.1 s; run_code is never served


@pytest.fixture(scope="module", autouse=True)
def _code_template() -> None:
    """Overrides the package's: these servers never need code-interpreter-v1 built."""


def clean(text: str, label: str) -> None:
    for leak in LEAKS:
        assert leak not in text, f"{label}: {leak!r} in {text[:300]}"


def check_answer(case: Case, reply: dict[str, Any]) -> None:
    """The response to a request the corpus expects an answer for."""
    if case.code is not None:
        assert reply.get("error", {}).get("code") == case.code, (case.label, reply)
    if case.names is not None:
        if "error" in reply:
            text = reply["error"]["message"]
        else:
            assert reply["result"].get("isError"), (case.label, reply)
            text = reply["result"]["content"][0]["text"]
        assert case.names in text, (case.label, text)


def null_errors(replies: list[Any]) -> list[dict[str, Any]]:
    return [r for r in replies if isinstance(r, dict) and r.get("id") is None and "error" in r]


def check_unanswerable(case: Case, replies: list[Any]) -> None:
    """What a message without a usable id gets: per ``case.expect``."""
    nulls, arrays = null_errors(replies), [r for r in replies if isinstance(r, list)]
    if case.expect == "none":
        assert not nulls and not arrays, (case.label, replies)
    elif case.expect == "null":
        assert len(nulls) == 1 and not arrays, (case.label, replies)
        if case.code is not None:
            assert nulls[0]["error"]["code"] == case.code, (case.label, nulls)
    elif case.expect == "batch":
        assert len(nulls) + len(arrays) == 1, (case.label, replies)
        for item in arrays[0] if arrays else nulls:
            assert item["error"]["code"] == INVALID, (case.label, item)


# ---- STDIO --------------------------------------------------------------------------------

class Stdio:
    """One STDIO server; each message is followed by a ping that marks where its answers end."""

    def __init__(self) -> None:
        self.srv = RawServer(**BASE)
        self.by_id: dict[Any, dict[str, Any]] = {}
        self.n = 0

    def read(self, label: str) -> Any:
        line = self.srv.recv_line(60)
        clean(line.decode(), label)
        msg = json.loads(line)
        if isinstance(msg, dict) and msg.get("id") is not None:
            self.by_id[msg["id"]] = msg
        return msg

    def exchange(self, raw: bytes, label: str = "") -> list[Any]:
        """Send one line; the answers that came before the marker ping's."""
        self.n += 1
        mark = f"mark-{self.n}"
        self.srv.send_bytes(raw + b"\n" + json.dumps(
            {"jsonrpc": "2.0", "id": mark, "method": "ping"}).encode() + b"\n")
        got = []
        while (msg := self.read(label)) != {"jsonrpc": "2.0", "id": mark, "result": {}}:
            got.append(msg)
        assert self.srv.proc.poll() is None, f"server died on {label}"
        return got

    def wait_for(self, ids: set[Any], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while ids - set(self.by_id) and time.monotonic() < deadline:
            self.read("late answers")
        assert not ids - set(self.by_id), f"never answered: {sorted(map(str, ids))[:10]}"

    def call(self, msg_id: Any, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        self.exchange(json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call",
                                  "params": {"name": tool, "arguments": args}}).encode())
        self.wait_for({msg_id})
        return self.by_id[msg_id]


@pytest.fixture(scope="module")
def stdio() -> Iterator[Stdio]:
    session = Stdio()
    session.srv.initialize()
    yield session
    assert session.srv.close() == 0


def tool_schemas(listing: dict[str, Any]) -> list[dict[str, Any]]:
    tools = listing["result"]["tools"]
    assert len(tools) == len(ALL_TOOLS)
    return tools


def test_stdio_survives_what_used_to_kill_it(stdio: Stdio) -> None:
    deep = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":' + b"[" * 1000 + \
        b"]" * 1000 + b"}}"
    stdio.exchange(deep)
    assert stdio.by_id[1]["error"]["code"] == INVALID and "64" in stdio.by_id[1]["error"]["message"]
    stdio.exchange(b'{"jsonrpc":"2.0","id":2,"method":"\\ud800","params":{}}')
    assert stdio.by_id[2]["error"]["code"] == INVALID
    assert "surrogate" in stdio.by_id[2]["error"]["message"]
    got = stdio.exchange(b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}')
    assert got[0]["id"] is None and got[0]["error"]["code"] == INVALID and "'id'" in \
        got[0]["error"]["message"]


@pytest.mark.parametrize("literal", ["1.5", "true", "null", "{}", "[1]"])
def test_stdio_invalid_ids_get_invalid_request(stdio: Stdio, literal: str) -> None:
    got = stdio.exchange(b'{"jsonrpc":"2.0","id":%s,"method":"ping"}' % literal.encode())
    assert len(got) == 1 and got[0]["id"] is None and got[0]["error"]["code"] == INVALID
    assert "'id'" in got[0]["error"]["message"]


def test_stdio_numeric_and_text_arguments_are_named(stdio: Stdio) -> None:
    cases = [("run_command", {"command": "true", "timeout": "NaN"},
              "run_command: 'timeout' must be a finite number between 0.001 and 86400, got NaN"),
             ("process_output", {"pid": "1e400"}, "'pid' must be a whole number between 1 "
                                                   "and 4194304, got Infinity"),
             ("read_file", {"path": '"/x"', "offset": str(10 ** 30)}, "'offset'"),
             ("run_command", {"command": "true", "timeout": "Infinity"}, "got Infinity")]
    for n, (tool, args, want) in enumerate(cases):
        body = ",".join(f'"{k}":{v}' if k != "command" else f'"{k}":"{v}"'
                        for k, v in args.items())
        raw = (f'{{"jsonrpc":"2.0","id":{500 + n},"method":"tools/call","params":{{"name":'
               f'"{tool}","arguments":{{{body}}}}}}}').encode()
        stdio.exchange(raw)
        stdio.wait_for({500 + n})
        result = stdio.by_id[500 + n]["result"]
        assert result["isError"] and want in result["content"][0]["text"], result
    stdio.exchange(json.dumps({"jsonrpc": "2.0", "id": 510, "method": "tools/call", "params": {
        "name": "write_file", "arguments": {"path": "/tmp/s", "content": "a\ud800"}}}).encode())
    error = stdio.by_id[510]["error"]
    assert error["code"] == PARAMS and "content" in error["message"], error


def test_stdio_fuzz(stdio: Stdio) -> None:
    stdio.exchange(b'{"jsonrpc":"2.0","id":"list","method":"tools/list"}')
    cases = build(tool_schemas(stdio.by_id["list"]))
    assert len(cases) >= 300, len(cases)
    started = time.monotonic()
    for case in cases:
        got = stdio.exchange(case.raw, case.label)
        if case.expect != "id":
            check_unanswerable(case, got)
    stdio.wait_for({c.msg_id for c in cases if c.expect == "id"})
    for case in cases:
        if case.expect == "id":
            check_answer(case, stdio.by_id[case.msg_id])
    ok = stdio.call("after", "run_command", {"command": "echo ok"})["result"]
    assert not ok.get("isError") and ok["structuredContent"]["stdout"] == "ok\n", ok
    assert time.monotonic() - started < 60


def test_stdio_calls_before_initialize() -> None:
    srv = RawServer(**BASE)
    try:
        srv.request(1, "tools/call", {"name": "run_command", "arguments": {"command": "id"}})
        reply = srv.recv()
        assert reply["id"] == 1 and reply["error"]["code"] == INVALID
        assert "initialize" in reply["error"]["message"]
        srv.request(2, "tools/list")
        assert "not initialized" in srv.recv()["error"]["message"]
        srv.request(3, "ping")
        assert srv.recv() == {"jsonrpc": "2.0", "id": 3, "result": {}}
        srv.initialize()
        srv.request(4, "tools/list")
        assert len(srv.recv()["result"]["tools"]) == len(ALL_TOOLS)
    finally:
        assert srv.close() == 0


# ---- HTTP ---------------------------------------------------------------------------------

class Http:
    def __init__(self) -> None:
        self.server = Uvicorn(**BASE)
        self.client = httpx.Client(timeout=60)
        r = self.client.post(self.server.url + "/mcp", json=INIT, headers=ACCEPT)
        self.sid = r.headers["mcp-session-id"]
        self.post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def post(self, raw: bytes, label: str = "", session: bool = True
             ) -> tuple[int, list[Any]]:
        headers = {**ACCEPT, **({"Mcp-Session-Id": self.sid} if session else {})}
        r = self.client.post(self.server.url + "/mcp", content=raw, headers=headers)
        clean(r.text, label)
        assert r.status_code < 500, (label, r.status_code, r.text[:300])
        assert self.server.proc.poll() is None, f"server died on {label}"
        if not r.text:
            return r.status_code, []
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            return r.status_code, [json.loads(line[5:]) for line in r.text.splitlines()
                                   if line.startswith("data:") and line[5:].strip()]
        return r.status_code, [r.json()]


@pytest.fixture(scope="module")
def http() -> Iterator[Http]:
    session = Http()
    yield session
    session.client.close()
    session.server.stop()


@pytest.mark.parametrize("literal", ["1.5", "true", "null", "{}", "[1]", '"\\ud800"'])
def test_http_invalid_ids_get_invalid_request(http: Http, literal: str) -> None:
    status, got = http.post(b'{"jsonrpc":"2.0","id":%s,"method":"ping"}' % literal.encode())
    assert status == 400 and got[0]["id"] is None and got[0]["error"]["code"] == INVALID, got


def test_http_fuzz(http: Http) -> None:
    status, got = http.post(b'{"jsonrpc":"2.0","id":"list","method":"tools/list"}')
    cases = [c for c in build(tool_schemas(got[0])) if not c.stdio_only]
    assert len(cases) >= 300, len(cases)
    started = time.monotonic()
    for case in cases:
        status, got = http.post(case.raw, case.label)
        if case.expect == "id":
            answers = [m for m in got if isinstance(m, dict) and m.get("id") == case.msg_id]
            assert answers, (case.label, status, got)
            check_answer(case, answers[0])
        elif case.expect == "none":
            assert status == 202 and not got, (case.label, status, got)
        else:
            assert status in (400, 413), (case.label, status)
            check_unanswerable(case, got)
    status, got = http.post(json.dumps({"jsonrpc": "2.0", "id": "after", "method": "tools/call",
                                        "params": {"name": "run_command",
                                                   "arguments": {"command": "echo ok"}}}).encode())
    ok = next(m for m in got if m.get("id") == "after")["result"]
    assert not ok.get("isError") and ok["structuredContent"]["stdout"] == "ok\n", ok
    assert time.monotonic() - started < 60


def test_http_calls_before_initialize(http: Http) -> None:
    status, got = http.post(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
                            b'"run_command","arguments":{"command":"id"}}}', session=False)
    assert status == 400 and got and "error" in got[0], got
    assert "session" in got[0]["error"]["message"].lower()
