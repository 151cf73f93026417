"""The early ``initialize`` answer: what it says must be what the SDK would say."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from agent_sandbox.surfaces.mcp.early_stdio import HANDSHAKE_VERSIONS, early_answer
from agent_sandbox.surfaces.mcp.tools import ALL_TOOLS


def test_versions_spelled_out_are_the_sdks() -> None:
    assert tuple(HANDSHAKE_VERSIONS) == tuple(HANDSHAKE_PROTOCOL_VERSIONS)


def line(**msg: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **msg}).encode()


@pytest.mark.parametrize(("asked", "spoken"), [
    (None, "2024-11-05"), ("2025-06-18", "2025-06-18"), ("2025-11-25", "2025-11-25"),
    ("1999-01-01", "2024-11-05"), (7, "2024-11-05")])
def test_version_is_negotiated_like_the_stdio_server(asked: object, spoken: str) -> None:
    params = {} if asked is None else {"protocolVersion": asked}
    found = early_answer(line(id=1, method="initialize", params=params))
    assert found is not None
    assert found[1]["result"]["protocolVersion"] == spoken


@pytest.mark.parametrize("raw", [
    b"not json", b"[1]", line(id=1, method="tools/list"), line(id=None, method="initialize"),
    line(id=True, method="initialize"), line(id=1.5, method="initialize"),
    line(id=1 << 70, method="initialize"), line(id={"a": 1}, method="initialize"),
    line(id=1, method="initialize", params=[]),
    line(id=1, method="initialize", params={"_meta": {}}),
    json.dumps({"jsonrpc": "1.0", "id": 1, "method": "initialize"}).encode(),
    line(id=1, method="initialize", params={"x": "y" * 70000}),
])
def test_anything_unusual_is_left_to_the_sdk(raw: bytes) -> None:
    assert early_answer(raw) is None


@pytest.mark.integration
def test_early_answer_equals_the_sdks_and_the_session_works() -> None:
    """The first initialize is answered early; a second one (same params) is answered by
    the SDK itself: the two results must be identical, and the session must be usable."""
    from _helpers import ROOT, server_env

    params = {"protocolVersion": "2025-06-18", "capabilities": {},
              "clientInfo": {"name": "t", "version": "1"}}
    msgs = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": params},
            {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}]
    data = "".join(json.dumps(m) + "\n" for m in msgs).encode()
    out = subprocess.run([sys.executable, "-m", "agent_sandbox.surfaces.mcp"], input=data,
                         capture_output=True, cwd=ROOT, env=server_env(), timeout=120)
    answers = [json.loads(x) for x in out.stdout.splitlines()]
    assert [a["id"] for a in answers] == [1, 2, 3], answers
    assert answers[0]["result"] == answers[1]["result"]
    assert len(answers[2]["result"]["tools"]) == len(ALL_TOOLS)
    assert b"differs" not in out.stderr
