"""A recipe template over MCP: list_templates shows it (kind, parent, the default marked),
create_sandbox accepts it (its USER, WORKDIR and files are there), and an unknown
template's error lists the templates there are, recipes included."""

from __future__ import annotations

import anyio
import pytest
from _helpers import stdio_params
from mcp import Client

from agent_sandbox.providers.local import local_provider

pytestmark = pytest.mark.integration


def test_create_sandbox_takes_a_recipe_template() -> None:
    local_provider().build_recipe(
        "mcp-recipe", "FROM base\nWORKDIR /opt/mcp\nRUN echo from-recipe > made\nUSER user\n",
        network="off")

    async def main() -> None:
        async with Client(stdio_params(), mode="legacy") as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert "list_templates" in (tools["create_sandbox"].description or "")
            assert tools["list_templates"].annotations.read_only_hint  # type: ignore[union-attr]
            r = await c.call_tool("list_templates", {})
            assert not r.is_error, r.content
            listed = {t["name"]: t for t in (r.structured_content or {})["templates"]}
            mine = listed["mcp-recipe"]
            assert (mine["kind"], mine["parent"], mine["default"]) == ("recipe", "base", False)
            assert mine["layers"] == 2 and mine["workdir"] == "/opt/mcp"
            assert len([n for n, t in listed.items() if t["default"]]) == 1 and "base" in listed
            assert "mcp-recipe (recipe, built on base)" in r.content[0].text  # type: ignore[union-attr]
            r = await c.call_tool("create_sandbox", {"template": "no-such-template"})
            assert r.is_error and "mcp-recipe" in r.content[0].text  # type: ignore[union-attr]
            r = await c.call_tool("create_sandbox", {"template": "mcp-recipe"})
            assert not r.is_error, r.content
            # (run_command's workdir defaults to /workspace in the tool's own schema)
            r = await c.call_tool("run_command", {"command": "whoami; cat /opt/mcp/made"})
            out = (r.structured_content or {})["stdout"].split()
            assert out == ["user", "from-recipe"], r.structured_content

    anyio.run(main)
