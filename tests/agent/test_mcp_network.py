"""The operator's network ceiling over the real STDIO MCP server and the official client:
the model may ask for what the ceiling allows (default `registries`), never more, and
the tool descriptions tell it so."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from _helpers import kill_quietly, sandbox_ids, stdio_params
from mcp import Client

pytestmark = pytest.mark.integration


async def call(client: Client, tool: str, **args: Any) -> tuple[bool, dict[str, Any], str]:
    r = await client.call_tool(tool, args)
    text = r.content[0].text if r.content else ""  # type: ignore[union-attr]
    return r.is_error, r.structured_content or {}, text


def run(body: Any, **env: str) -> Any:
    async def main() -> Any:
        async with Client(stdio_params(**env), mode="legacy") as client:
            return await body(client)

    return anyio.run(main)


def assert_beyond_ceiling(err: bool, data: dict[str, Any], text: str, ceiling: str) -> None:
    assert err, text
    assert data["error"]["code"] == "permission_denied", data
    assert f"the network ceiling is {ceiling}" in text, text
    assert "this MCP server's operator" in text and "ABX_MCP_NETWORK_CEILING" in text, text


def test_descriptions_name_the_ceiling() -> None:
    async def body(c: Client) -> dict[str, str]:
        return {t.name: t.description or "" for t in (await c.list_tools()).tools}

    default = run(body)
    for tool in ("create_sandbox", "set_network"):
        assert "at most 'registries' or any part of it" in default[tool], default[tool]
        assert "only the operator can raise" in default[tool]
    lowered = run(body, ABX_MCP_NETWORK_CEILING="pypi.org,files.pythonhosted.org")
    assert "at most 'pypi.org,files.pythonhosted.org' or any part" in lowered["set_network"]
    assert "no network at all" in run(body, ABX_MCP_NETWORK_CEILING="off")["create_sandbox"]


def test_asking_beyond_the_ceiling_is_refused_and_makes_nothing() -> None:
    before = sandbox_ids()

    async def body(c: Client) -> None:
        for network, ceiling in (("full", "allowlist (registries)"),
                                 ("pypi.org,github.com", "allowlist (registries)"),
                                 ("*.ubuntu.com", "allowlist (registries)")):
            err, data, text = await call(c, "create_sandbox", network=network)
            assert_beyond_ceiling(err, data, text, ceiling)
        # No default sandbox yet: set_network refuses on the ceiling, and creates none.
        err, data, text = await call(c, "set_network", network="full")
        assert_beyond_ceiling(err, data, text, "allowlist (registries)")
        err, data, text = await call(c, "set_network", network="registries")
        assert err and data["error"]["code"] == "not_found" and "no default sandbox" in text
        # A bad policy is a bad argument, named as such.
        err, data, text = await call(c, "create_sandbox", network="pypi.org:443")
        assert err and data["error"]["code"] == "invalid_argument"
        assert "'network' is not a network policy" in text
        err, data, text = await call(c, "create_sandbox", network=True)
        assert err and "'network' must be a string" in text

    run(body)
    assert sandbox_ids() - before == set()


def test_ceiling_off_refuses_any_network() -> None:
    async def body(c: Client) -> None:
        err, data, text = await call(c, "create_sandbox", network="registries")
        assert_beyond_ceiling(err, data, text, "off")

    run(body, ABX_MCP_NETWORK_CEILING="off")


def test_within_the_ceiling_is_accepted_and_set_network_is_held_to_it() -> None:
    made: list[str] = []

    async def body(c: Client) -> None:
        err, data, text = await call(c, "create_sandbox", network="registries")
        assert not err, text
        sandbox = data["sandbox"]
        made.append(sandbox["sandbox_id"])
        assert sandbox["network"] == {"mode": "allowlist", "allow_out": ["registries"],
                                      "deny_out": []}
        assert "network allowlist (registries)" in text
        # Narrower: fine; then back to off; beyond: refused, the policy unchanged.
        err, data, text = await call(c, "set_network", network="pypi.org")
        assert not err, text
        assert data["sandbox"]["network"]["allow_out"] == ["pypi.org"]
        assert "is now allowlist (pypi.org)" in text
        err, data, text = await call(c, "set_network", network="full",
                                     sandbox_id=made[0])
        assert_beyond_ceiling(err, data, text, "allowlist (registries)")
        err, data, _ = await call(c, "list_sandboxes")
        [mine] = [s for s in data["sandboxes"] if s["sandbox_id"] == made[0]]
        assert mine["network"]["allow_out"] == ["pypi.org"]
        err, data, _ = await call(c, "set_network", network="off")
        assert not err and data["sandbox"]["network"]["mode"] == "off"
        # The default (no network argument) is off.
        err, data, _ = await call(c, "create_sandbox")
        assert not err and data["sandbox"]["network"]["mode"] == "off"
        made.append(data["sandbox"]["sandbox_id"])

    try:
        run(body)
    finally:
        for sandbox_id in made:
            kill_quietly(sandbox_id)


def test_operator_may_allow_full() -> None:
    made: list[str] = []

    async def body(c: Client) -> None:
        err, data, text = await call(c, "create_sandbox", network="full")
        assert not err, text
        made.append(data["sandbox"]["sandbox_id"])
        assert data["sandbox"]["network"]["mode"] == "full"

    try:
        run(body, ABX_MCP_NETWORK_CEILING="full")
    finally:
        for sandbox_id in made:
            kill_quietly(sandbox_id)
