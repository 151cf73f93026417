"""The servers against real Node clients: the MCP Inspector CLI and the official
TypeScript SDK, installed from npm (pinned in node/package.json) into a cache outside the
checkout (``npmcache``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest
from _helpers import ROOT, Uvicorn, server_env
from npmcache import node_packages

from agent_sandbox.surfaces.mcp.tools import ALL_TOOLS

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent / "node"


@pytest.fixture(scope="module")
def node_dir() -> Path:
    return node_packages(HERE)


@pytest.fixture
def capped() -> Iterator[Uvicorn]:
    server = Uvicorn(ABX_MCP_MAX_SESSIONS="3")
    yield server
    server.stop()


def inspector(node_dir: Path, url: str, *args: str) -> dict:
    done = subprocess.run(
        ["node", str(node_dir / "node_modules/.bin/mcp-inspector"), "--cli", url,
         "--transport", "http", *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, "HOME": str(node_dir)})  # its catalog lands in the cache
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_inspector_strict_schema_lint_is_clean(node_dir: Path) -> None:
    """The Inspector's portability lint (--strict) over every tool's input and output
    schema, against the real STDIO server: no finding at all, warnings included."""
    done = subprocess.run(
        ["node", str(node_dir / "node_modules/.bin/mcp-inspector"), "--cli", sys.executable,
         "-m", "agent_sandbox.surfaces.mcp", "--method", "tools/list", "--strict",
         "--format", "json"], capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**server_env(), "HOME": str(node_dir)})
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert len(out["result"]["tools"]) == len(ALL_TOOLS)
    assert "schemaFindings" not in out, json.dumps(out["schemaFindings"], indent=1)[:3000]
    assert "Warning:" not in done.stderr and "Error:" not in done.stderr, done.stderr[-3000:]


def test_ten_inspector_runs_with_three_sessions(node_dir: Path, capped: Uvicorn) -> None:
    """The Inspector CLI never sends DELETE: each run leaves its session behind."""
    url = capped.url + "/mcp"
    for run in range(10):
        if run in (2, 6):  # two runs that make a sandbox (their sessions are kept)
            out = inspector(node_dir, url, "--method", "tools/call", "--tool-name",
                            "run_command", "--tool-arg", f"command=echo run{run}")
            assert out["structuredContent"]["stdout"] == f"run{run}\n", out
        else:
            out = inspector(node_dir, url, "--method", "tools/list")
            assert len(out["tools"]) == len(ALL_TOOLS)
    health = httpx.get(capped.url + "/health").json()
    assert health["sessions"] <= 3 and health["sandboxes"] == 2


def test_typescript_sdk_abort_stops_the_command_inside(node_dir: Path) -> None:
    server = Uvicorn()
    try:
        done = subprocess.run(["node", str(node_dir / "cancel_sleep.mjs"), server.url + "/mcp"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["pid"].isdigit() and seen["aborted"], seen
        assert seen["inside"] == "gone", f"sleep 15 still ran after the abort: {seen}"
    finally:
        server.stop()
