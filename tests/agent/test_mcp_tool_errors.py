"""Tool errors reach the model whole, through both official clients.

A failed call is a result with ``isError`` and ``structuredContent: {"error": {...}}``,
which must conform to the tool's ``outputSchema`` (the spec's rule for every structured
result): the TypeScript SDK 1.x checks error results too, and threw "Structured content
does not match the tool's output schema" instead of handing over our message. Four
failures a model meets: a wrong argument, a network above the operator's ceiling, a killed
sandbox, a busy server; and two a file edited by others brings: a stale ``if_match``
(``conflict``) and another's lock (``locked``, with ``retry_after``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest
from _helpers import Uvicorn, stdio_params
from mcp import Client
from npmcache import node_packages

pytestmark = pytest.mark.integration
NODE = Path(__file__).parent / "node"

# What each failure says: its code, and words of its message the model needs.
EXPECTED = {
    "wrong_argument": ("invalid_argument", ["memory_mb", "-5"]),
    "refused_network": ("permission_denied", ["full", "ceiling"]),
    "killed_sandbox": ("not_found", ["no sandbox"]),
    "busy": ("resource_exhausted", ["busy", "retry after"]),
    "conflict": ("conflict", ["has changed since that version", "read it again"]),
    "locked": ("locked", ["locked by MCP session", "another task"]),
}


def _check(seen: dict[str, Any], schemas: dict[str, Any]) -> None:
    tools = {"wrong_argument": "create_sandbox", "refused_network": "create_sandbox",
             "killed_sandbox": "run_command", "busy": "list_sandboxes",
             "conflict": "write_file", "locked": "write_file"}
    for case, (code, words) in EXPECTED.items():
        got = seen[case]
        assert "threw" not in got, f"{case}: the client threw instead: {got['threw']}"
        assert got["isError"], (case, got)
        error = got["structured"]["error"]
        assert got["structured"] == {"error": error}, (case, got)
        assert error["code"] == code, (case, error)
        # The model sees the whole message, with the code.
        assert got["text"] == f"Error [{code}]: {error['message']}", (case, got)
        for word in words:
            assert word in error["message"], (case, word, error["message"])
        # Valid under the tool's own schema, as listed to clients.
        jsonschema.validate(got["structured"], schemas[tools[case]])
    assert seen["busy"]["structured"]["error"]["retry_after"] > 0
    locked = seen["locked"]["structured"]["error"]
    assert locked["retry_after"] >= 1 and locked["details"]["holder"].startswith("MCP session")
    assert seen["conflict"]["structured"]["error"]["details"]["current_version"]
    assert not seen["lock_write"]["isError"], seen["lock_write"]
    assert not seen["slow"].get("isError") and "threw" not in seen["slow"], seen["slow"]


def test_typescript_sdk_sees_every_tool_error() -> None:
    node_dir = node_packages(NODE)
    server = Uvicorn(ABX_MCP_MAX_CONCURRENCY="1")
    try:
        done = subprocess.run(["node", str(node_dir / "tool_errors.mjs"), server.url + "/mcp"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        schemas = _listed_schemas(Client(server.url + "/mcp", mode="legacy"))
    finally:
        server.stop()
    _check(seen, schemas)


def test_python_sdk_sees_every_tool_error() -> None:
    async def call(c: Client, tool: str, **args: Any) -> dict[str, Any]:
        r = await c.call_tool(tool, args)
        return {"isError": r.is_error, "text": r.content[0].text,  # type: ignore[union-attr]
                "structured": r.structured_content}

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(stdio_params(ABX_MCP_MAX_CONCURRENCY="1"), mode="legacy") as c:
            schemas = {t.name: t.output_schema for t in (await c.list_tools()).tools}
            seen = {"wrong_argument": await call(c, "create_sandbox", memory_mb=-5),
                    "refused_network": await call(c, "create_sandbox", network="full")}
            sid = (await call(c, "run_command", command="true"))["structured"]["sandbox_id"]
            await call(c, "write_file", path="edited.txt", content="1")
            version = (await call(c, "read_file", path="edited.txt"))["structured"]["version"]
            await call(c, "write_file", path="edited.txt", content="2")
            seen["conflict"] = await call(c, "write_file", path="edited.txt", content="3",
                                          if_match=version)
            lock = await call(c, "lock_file", path="edited.txt", ttl=60)
            seen["locked"] = await call(c, "write_file", path="edited.txt", content="4",
                                        lock_wait=0)
            seen["lock_write"] = await call(c, "write_file", path="edited.txt", content="5",
                                            lock_token=lock["structured"]["token"])
            await call(c, "kill_sandbox", sandbox_id=sid)
            seen["killed_sandbox"] = await call(c, "run_command", sandbox_id=sid,
                                                command="true")
            async with anyio.create_task_group() as tg:
                async def slow() -> None:
                    seen["slow"] = await call(c, "run_command", command="sleep 2")

                tg.start_soon(slow)
                await anyio.sleep(0.5)  # STDIO keeps the order: the slow call has the slot
                seen["busy"] = await call(c, "list_sandboxes")
            return seen, schemas

    seen, schemas = anyio.run(main)
    _check(seen, schemas)


def _listed_schemas(client: Client) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with client as c:
            return {t.name: t.output_schema for t in (await c.list_tools()).tools}

    return anyio.run(main)
