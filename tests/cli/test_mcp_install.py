"""``abx mcp install|uninstall`` against every client's config file."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from conftest import ABX, Abx

pytestmark = pytest.mark.integration

TARGETS = ["cursor", "claude", "vscode", "windsurf", "claude-code", "codex", "gemini"]
KEY = "sk-test-key-0123456789abcdef"


def config_file(abx: Abx, target: str, scope: str | None = None) -> Path:
    h, p = abx.home, abx.cwd
    return {
        ("cursor", "user"): h / ".cursor/mcp.json",
        ("cursor", "project"): p / ".cursor/mcp.json",
        ("claude", "user"): h / ".config/Claude/claude_desktop_config.json",
        ("vscode", "project"): p / ".vscode/mcp.json",
        ("vscode", "user"): h / ".config/Code/User/mcp.json",
        ("windsurf", "user"): h / ".codeium/windsurf/mcp_config.json",
        ("claude-code", "user"): h / ".claude.json",
        ("claude-code", "project"): p / ".mcp.json",
        ("codex", "user"): h / ".codex/config.toml",
        ("codex", "project"): p / ".codex/config.toml",
        ("gemini", "user"): h / ".gemini/settings.json",
        ("gemini", "project"): p / ".gemini/settings.json",
    }[(target, scope or ("project" if target == "vscode" else "user"))]


def servers_key(target: str) -> str:
    return {"vscode": "servers", "codex": "mcp_servers"}.get(target, "mcpServers")


def load(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(
        path.read_text())


def ours(abx: Abx, target: str, scope: str | None = None) -> dict[str, Any] | None:
    return load(config_file(abx, target, scope)).get(servers_key(target), {}).get(
        "agent-sandbox")


def existing_content(target: str) -> bytes:
    if target == "codex":
        return (b'# keep this comment\nmodel = "o3"\n\n[mcp_servers.other]\ncommand = "npx"\n'
                b'args = ["-y", "other-server"]\n\n[profiles.fast]\nmodel = "gpt-5"\n')
    doc = {"theme": "dark", "nested": {"a": [1, 2.5, None, True]},
           servers_key(target): {"other": {"command": "npx", "args": ["-y", "other-server"],
                                           "env": {"TOKEN": "keep-me"}}}}
    return json.dumps(doc, indent=4).encode()


@pytest.mark.parametrize("target", TARGETS)
def test_install_into_empty_then_uninstall(abx: Abx, target: str) -> None:
    r = abx("mcp", "install", "--target", target, "--json")
    path = config_file(abx, target)
    assert r.json()["path"] == str(path) and r.json()["changed"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    entry = ours(abx, target)
    assert entry is not None
    assert entry["command"] == str(ABX) and entry["args"] == ["mcp", "start"]
    assert Path(entry["command"]).is_absolute()
    if target in ("vscode", "claude-code"):
        assert entry["type"] == "stdio"
    assert "env" not in entry  # no key anywhere to resolve
    # Installing twice changes nothing.
    assert abx("mcp", "install", "--target", target, "--json").json()["changed"] is False
    abx("mcp", "uninstall", "--target", target)
    assert ours(abx, target) is None
    # Uninstalling again is fine.
    assert abx("mcp", "uninstall", "--target", target, "--json").json()["removed"] is False


@pytest.mark.parametrize("target", TARGETS)
def test_install_keeps_other_servers_mode_and_backs_up(abx: Abx, target: str) -> None:
    path = config_file(abx, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    original = existing_content(target)
    path.write_bytes(original)
    path.chmod(0o644)
    before = load(path)
    r = abx("mcp", "install", "--target", target, "--json").json()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # mode kept
    assert Path(r["backup"]).read_bytes() == original
    after = load(path)
    entry = after[servers_key(target)].pop("agent-sandbox")
    assert entry["args"] == ["mcp", "start"]
    assert after == before  # everything else kept, in meaning
    if target == "codex":
        assert "# keep this comment" in path.read_text()
    abx("mcp", "uninstall", "--target", target)
    assert load(path) == before


# What the user must still do, per client: phrases the installer's output must carry.
NEXT = {
    "cursor": ["Restart Cursor"],
    "claude": ["Quit Claude Desktop completely"],
    "vscode": ["Reload the VS Code window", "trust"],
    "windsurf": ["Refresh the MCP servers in Windsurf"],
    "claude-code": ["claude mcp list"],
    "codex": ["codex mcp list"],
    "gemini": ["trusted folders", "Disabled", "Trust folder", "/permissions", "/mcp"],
}
NEXT_PROJECT = {"claude-code": ["reset-project-choices"], "codex": ["trusted project"],
                "gemini": [".gemini/settings.json"]}


@pytest.mark.parametrize("target", TARGETS)
def test_install_says_what_is_left_to_do(abx: Abx, target: str) -> None:
    r = abx("mcp", "install", "--target", target)
    said = " ".join(r.out.split())  # undo line wrapping
    assert "Next:" in said
    for phrase in NEXT[target]:
        assert phrase in said, (phrase, r.out)
    steps = abx("mcp", "install", "--target", target, "--json").json()["next"]
    assert isinstance(steps, list) and all(isinstance(s, str) and s for s in steps)
    for phrase in NEXT_PROJECT.get(target, []):
        assert not any(phrase in s for s in steps), phrase  # user scope: not said
        project = abx("mcp", "install", "--target", target, "--scope", "project",
                      "--json").json()["next"]
        assert any(phrase in s for s in project), (phrase, project)


def test_status_flags_flip(abx: Abx) -> None:
    flags = [f"installed_{t.replace('-', '_')}" for t in TARGETS]
    status = abx("mcp", "status", "--json").json()
    assert [status[f] for f in flags] == [False] * len(TARGETS)
    assert status["server"] == "agent-sandbox" and status["transport"] == "stdio"
    assert "run_command" in status["tools"] and status["mcp_running"] is False
    for target in TARGETS[:4]:
        abx("mcp", "install", "--target", target)
    abx("mcp", "install", "--target", "codex", "--scope", "project")  # any scope counts
    status = abx("--json", "mcp", "status").json()
    expected = {*TARGETS[:4], "codex"}
    assert [status[f] for f in flags] == [t in expected for t in TARGETS]


NOT_STRICT = [
    b'{\n  // a comment\n  "mcpServers": {}\n}\n',
    b'{"mcpServers": {"other": {"command": "x"},},}\n',
    b'{"mcpServers": {}, "mcpServers": {}}\n',
]


@pytest.mark.parametrize("target", [t for t in TARGETS if t != "codex"])
def test_non_strict_json_is_refused_untouched(abx: Abx, target: str) -> None:
    path = config_file(abx, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    for i, content in enumerate(NOT_STRICT):  # comment, trailing comma, duplicate key
        path.write_bytes(content)
        for command in ("install", "uninstall") if i == 0 else ("install",):
            r = abx("mcp", command, "--target", target, check=1)
            assert "not strict JSON" in r.err and str(path) in r.err and "untouched" in r.err
            assert path.read_bytes() == content
    assert list(path.parent.glob("*.abx-backup")) == []


def test_codex_refuses_invalid_toml_and_inline_entries(abx: Abx) -> None:
    path = config_file(abx, "codex")
    path.parent.mkdir(parents=True)
    for content in (b'model = "o3\n', b'mcp_servers = { agent-sandbox = { command = "x" } }\n'):
        path.write_bytes(content)
        r = abx("mcp", "install", "--target", "codex", check=1)
        assert "untouched" in r.err
        assert path.read_bytes() == content


def test_api_key_only_in_cursor_and_claude_user_configs(abx: Abx) -> None:
    env = {"ABX_SANDBOX_API_KEY": KEY}
    for target in TARGETS:
        abx("mcp", "install", "--target", target, env=env)
    abx("mcp", "install", "--target", "cursor", "--scope", "project", env=env)
    abx("mcp", "install", "--target", "vscode", "--scope", "user", env=env)
    for target in ("cursor", "claude"):
        assert ours(abx, target)["env"] == {"ABX_SANDBOX_API_KEY": KEY}
    for target, scope in [("vscode", None), ("vscode", "user"), ("cursor", "project"),
                          ("windsurf", None), ("claude-code", None), ("codex", None),
                          ("gemini", None)]:
        assert "env" not in ours(abx, target, scope)
        assert KEY not in config_file(abx, target, scope).read_text()


def test_api_key_resolved_from_abx_config(abx: Abx) -> None:
    abx("config", "set", "sandbox_api_key", KEY)
    abx("config", "set", "base_url", "https://from-config.example")
    abx("mcp", "install", "--target", "claude")
    # The key resolves from ~/.abx; base URL and region only ever from the process env.
    assert ours(abx, "claude")["env"] == {"ABX_SANDBOX_API_KEY": KEY}
    abx("mcp", "install", "--target", "vscode",
        env={"ABX_SANDBOX_BASE_URL": "https://gw.example", "SANDBOX_REGION": "cn-hangzhou"})
    assert ours(abx, "vscode")["env"] == {"ABX_SANDBOX_BASE_URL": "https://gw.example",
                                          "SANDBOX_REGION": "cn-hangzhou"}


def test_module_fallback_writes_interpreter_and_module(abx: Abx) -> None:
    proc = subprocess.run([sys.executable, "-m", "agent_sandbox.surfaces.cli", "mcp", "install",
                           "--target", "gemini"], cwd=abx.cwd, env=abx.env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    entry = ours(abx, "gemini")
    assert entry["command"] == sys.executable
    assert entry["args"] == ["-m", "agent_sandbox.surfaces.cli", "mcp", "start"]


def test_usage_errors_exit_2(abx: Abx) -> None:
    assert "choose one of" in abx("mcp", "install", "--target", "emacs", check=2).err
    assert "no 'project' scope" in abx("mcp", "install", "--target", "claude", "--scope",
                                       "project", check=2).err
    abx("mcp", "install", check=2)  # --target missing
