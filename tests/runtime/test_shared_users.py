"""Real new users over the STDIO MCP server: the host's shared code-interpreter-v1 runs for
them without a copy of their own, and where no kernel template can be built (the package
index unreachable) run_command and the file tools still work while run_code says how to
get one."""

from __future__ import annotations

import os
import secrets
import shlex
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from wheels import wheel_script

from agent_sandbox.config.settings import Settings

pytestmark = pytest.mark.integration

# A wheel built inside the sandbox and pip-installed into the shared venv (a new package:
# new files in root's directories, through the user's mirror of them), offline.
_WHEEL = wheel_script("abxshared", "/workspace/")


@pytest.fixture
def new_user(local_users: Any) -> Iterator[Any]:
    """A user who has never run a sandbox (skips without runc or user namespaces)."""
    made = local_users.create_rootless()
    yield made
    made.clear_engine(env=made.env(**_engine_env()))


def _engine_env() -> dict[str, str]:
    """The template settings of this process, for the user's."""
    return {k: v for k, v in os.environ.items()
            if k in ("ABX_SHARED_TEMPLATES_DIR", "ABX_TEMPLATE_INDEX_URL")}


def _templates_dir(user: Any) -> Path:
    return user.home / ".local" / "share" / "agent-sandbox" / "templates"


def _params(user: Any, **extra: str) -> StdioServerParameters:
    argv = user.argv([user.python(), "-m", "agent_sandbox.surfaces.mcp"])
    return StdioServerParameters(command=argv[0], args=argv[1:], cwd=str(user.home),
                                 env=user.env(ABX_MCP_AUDIT_LOG="", **extra))


async def _call(client: Client, tool: str, **args: Any) -> tuple[bool, dict[str, Any], str]:
    r = await client.call_tool(tool, args)
    text = r.content[0].text if r.content else ""  # type: ignore[union-attr]
    return r.is_error, r.structured_content or {}, text


def test_new_user_runs_the_shared_code_template(code_template: str, new_user: Any) -> None:
    """The first run_command of a new user gets the shared code-interpreter-v1 (built by
    root, not copied); run_code works, and pip installs a new package into its venv."""
    shared = Settings().shared_templates_dir / code_template
    assert (shared / "template.json").is_file()
    timings: dict[str, float] = {}

    async def main() -> None:
        async with Client(_params(new_user, **_engine_env()), mode="legacy") as c:
            started = time.monotonic()
            err, data, text = await _call(
                c, "run_command",
                command="echo $VIRTUAL_ENV; python -c 'import numpy; print(numpy.__file__)'")
            timings["first run_command"] = time.monotonic() - started
            assert not err and data["exit_code"] == 0, text
            env, numpy_file = data["stdout"].split()
            assert env == "/opt/abx-python" and numpy_file.startswith(env), text
            err, data, text = await _call(c, "list_sandboxes")
            assert [s["template"] for s in data["sandboxes"]] == [code_template], text

            err, data, text = await _call(c, "run_code", code="import pandas\n6 * 7")
            assert not err and data["results"][0]["text"] == "42", text
            # Bash's kernel is in the shared venv too; R's trees (over /usr and /etc) carry
            # the host libraries a rootless base lacks. (Deno's V8 needs more address
            # space than a rootless sandbox's RLIMIT_AS: docs/engine.md.)
            err, data, text = await _call(c, "run_code", code="echo $((6 * 7))",
                                          language="bash")
            assert not err and data["stdout"] == "42\n", text
            err, data, text = await _call(c, "run_code", code="6 * 7", language="r")
            if "no r kernel" not in text:  # built without R on this host
                assert not err and data["results"][0]["text"] == "[1] 42", text

            install = (f"python -c {shlex.quote(_WHEEL)} && pip install -q --no-index "
                       "--root-user-action=ignore /workspace/abxshared-1.0-py3-none-any.whl"
                       " && python -c 'import abxshared; print(abxshared.__file__)'")
            err, data, text = await _call(c, "run_command", command=install, timeout=120)
            assert not err and data["exit_code"] == 0, text
            assert data["stdout"].strip().startswith("/opt/abx-python/lib/"), text

    anyio.run(main)
    print(f"new user's first run_command (STDIO, shared template): "
          f"{timings['first run_command'] * 1000:.0f} ms")
    # No copy of the template: only base and the mirror of its directories (no files).
    own = _templates_dir(new_user)
    assert sorted(p.name for p in own.iterdir() if not p.name.startswith(".")) == \
        ["_shared", "base"]
    mirror = own / "_shared" / code_template
    files = [p for p in mirror.rglob("*") if not p.is_dir() or p.is_symlink()]
    assert mirror.is_dir() and files == [], files[:5]
    assert sum(1 for _ in (own / "_shared").rglob("*")) > 100  # a real mirror


def test_index_unreachable_base_works_and_run_code_says_how(new_user: Any) -> None:
    """No shared template and the package index unreachable: run_command and the file
    tools work on base; run_code fails at once with the fix (not after pip's retries)."""
    with socket.socket() as closed:  # a local port nobody listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/simple"
    nowhere = f"/var/tmp/abx-no-shared-templates-{secrets.token_hex(4)}"  # never made
    env = {"ABX_SHARED_TEMPLATES_DIR": nowhere, "ABX_TEMPLATE_INDEX_URL": url}
    timings: dict[str, float] = {}

    async def main() -> None:
        async with Client(_params(new_user, **env), mode="legacy") as c:
            started = time.monotonic()
            err, data, text = await _call(c, "run_code", code="1 + 1")
            timings["run_code"] = time.monotonic() - started
            assert err, text
            for needed in (url, "is unreachable",
                           "abx template build code-interpreter-v1 --index-url",
                           "ABX_MCP_TEMPLATE", "run_command and the file tools work"):
                assert needed in text, (needed, text)

            err, data, text = await _call(c, "run_command", command="echo hi")
            assert not err and data["stdout"] == "hi\n", text
            err, data, text = await _call(c, "write_file", path="/workspace/a.txt",
                                          content="kept")
            assert not err, text
            err, data, text = await _call(c, "read_file", path="/workspace/a.txt")
            assert not err and text == "kept", text
            err, data, text = await _call(c, "list_sandboxes")
            assert [s["template"] for s in data["sandboxes"]] == ["base"], text

            # run_code on that default (base) sandbox: how to get a kernel, not just "none".
            err, data, text = await _call(c, "run_code", code="1 + 1")
            assert err and "runs template base" in text, text
            for needed in ("abx template build code-interpreter-v1 --index-url",
                           "ABX_MCP_TEMPLATE", "run_command with python3"):
                assert needed in text, (needed, text)

    anyio.run(main)
    print(f"run_code with the index unreachable failed in {timings['run_code'] * 1000:.0f} ms")
    assert not (_templates_dir(new_user) / "code-interpreter-v1").exists()
