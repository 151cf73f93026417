"""``abx mcp start`` with no options execs the STDIO server without importing the CLI, and
gives it the same settings the full CLI would."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import Abx

from agent_sandbox.config.settings import Settings, env_name
from agent_sandbox.surfaces.cli import mcp_server, runstate, stdio_launch
from agent_sandbox.surfaces.cli import settings as cli_settings_module

CLI_ONLY = ("typer", "rich", "click", "pydantic", "pydantic_settings",
            "agent_sandbox.surfaces.cli.app", "agent_sandbox.surfaces.cli.settings",
            "agent_sandbox.config.settings")


def test_variable_names_are_the_settings_ones() -> None:
    assert {k.name: k.env for k in cli_settings_module.KEYS.values()} == stdio_launch.CONFIG_VARS
    assert env_name("mcp_runtime_dir") == stdio_launch.RUNTIME_DIR_VAR
    assert stdio_launch.runtime_dir({}) == Settings().mcp_runtime_dir
    assert stdio_launch.SERVER_MODULE in runstate.MARKERS


SCENARIOS = [
    # (environment, ./.env, ~/.abx/config)
    ({}, {}, {}),
    ({}, {"ABX_MCP_TOOLS": "read-only", "ABX_SANDBOX_API_KEY": "sk-dotenv"},
     {"sandbox_api_key": "sk-config", "region": "cn-hangzhou", "base_url": "https://gw.x"}),
    ({"ABX_SANDBOX_API_KEY": "sk-env", "ABX_MCP_TOOLS": "  "}, {"ABX_MCP_TOOLS": "run_command"},
     {"sandbox_api_key": "sk-config", "mcp_tools": "read_file"}),
    ({"ABX_DEFAULT_TEMPLATE": "mytpl"}, {}, {}),
    ({}, {"ABX_DEFAULT_TEMPLATE": "fromdotenv"}, {"mcp_template": "fromconfig"}),
    ({"ABX_MCP_TEMPLATE": "explicit"}, {"ABX_DEFAULT_TEMPLATE": "ignored"}, {}),
    ({}, {}, {"default_template": "cfg-default"}),
]


@pytest.mark.parametrize(("environ", "dotenv", "config"), SCENARIOS)
def test_same_server_settings_as_the_full_cli(
        environ: dict[str, str], dotenv: dict[str, str], config: dict[str, str],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(stdio_launch.CONFIG_VARS.values()) + [stdio_launch.RUNTIME_DIR_VAR]:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    home = tmp_path / "home"
    (home / ".abx").mkdir(parents=True)
    (home / ".abx" / "config").write_text(json.dumps(config))
    project = tmp_path / "project"
    project.mkdir()
    (project / ".env").write_text("".join(f"{k}={v}\n" for k, v in dotenv.items()))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(project)
    cli_settings_module.env_settings.cache_clear()
    cli_settings_module.cli_settings.cache_clear()
    try:
        slow = mcp_server.plan_start(http=False, host="127.0.0.1", port=9000, background=False,
                                     auth_token_file=None, generate_token=False, template=None,
                                     tools=None).env
    finally:
        cli_settings_module.env_settings.cache_clear()
        cli_settings_module.cli_settings.cache_clear()
    fast = stdio_launch.server_env(dict(os.environ))
    names = stdio_launch.CONFIG_VARS.values()
    assert ({n: fast.get(n, "").strip() for n in names}
            == {n: slow.get(n, "").strip() for n in names})


def test_other_command_lines_go_to_the_full_cli(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(stdio_launch.RUNTIME_DIR_VAR, str(tmp_path / "run"))
    for argv in ([], ["mcp"], ["mcp", "start", "--http"], ["mcp", "start", "-q"],
                 ["--json", "mcp", "start"], ["mcp", "status"]):
        assert stdio_launch.exec_server(argv) is None  # returned: not exec'd
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_abx_mcp_start_execs_the_server_without_the_cli(abx: Abx) -> None:
    """The installed command, with settings only in ./.env and ~/.abx/config: the server
    gets them, runs under the launcher's pid (exec), and the launcher imported no CLI."""
    (abx.cwd / ".env").write_text("ABX_MCP_TOOLS=read-only\n")
    (abx.home / ".abx").mkdir()
    (abx.home / ".abx" / "config").write_text(json.dumps({"mcp_template": "base"}))
    err_file = abx.cwd / "stderr.txt"  # a file: the import list would fill a pipe
    with err_file.open("w") as err_out:
        proc = subprocess.Popen([*abx.command, "mcp", "start"], cwd=abx.cwd,
                                env={**abx.env, "PYTHONPROFILEIMPORTTIME": "1"},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err_out, text=True)
    assert proc.stdin and proc.stdout
    try:
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                     "params": {}}) + "\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list",
                                     "params": {}}) + "\n")
        proc.stdin.flush()
        tools = {t["name"] for t in json.loads(proc.stdout.readline())["result"]["tools"]}
        assert tools == {"list_sandboxes", "list_templates", "read_file", "list_files",
                         "process_output"}
        record = json.loads((abx.home / ".abx" / "run" / "mcp-server.json").read_text())
        assert record["pid"] == proc.pid and record["transport"] == "stdio"
        assert abx("mcp", "status", "--json").json()["mcp_running"] is True
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    err = err_file.read_text()
    assert proc.returncode == 0, err
    # Each interpreter start prints the import-time header: the launcher's imports are
    # those before the second one (the exec'd server's).
    lines = [line for line in err.splitlines() if line.startswith("import time:")]
    starts = [i for i, line in enumerate(lines) if "imported package" in line]
    assert len(starts) == 2, "expected the launcher and then the exec'd server"
    launcher = {line.rsplit("|", 1)[1].strip() for line in lines[starts[0] + 1:starts[1]]}
    assert "agent_sandbox.surfaces.cli.stdio_launch" in launcher
    assert not launcher & set(CLI_ONLY), launcher & set(CLI_ONLY)
    assert "  template: base\n" in err  # from ~/.abx/config
