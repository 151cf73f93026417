"""The one settings object: defaults, environment, bad values, children and the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.config.reference import with_table
from agent_sandbox.config.settings import (
    Settings,
    SettingsError,
    builtin_data_dir,
    child_env,
    env_name,
)
from agent_sandbox.surfaces.http.keys import KeyStore
from agent_sandbox.surfaces.mcp.config import AgentConfig, with_warm_pool

ROOT = Path(__file__).resolve().parents[1]
VARIABLES = [env_name(f) for f in Settings.model_fields]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No settings variable set (the test session's ABX_DATA_DIR and ABX_POOL_SIZE included)."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_defaults(clean_env: pytest.MonkeyPatch) -> None:
    s = Settings()
    assert (s.engine, s.sandbox_base_url, s.daemon_socket) == ("auto", "", "/run/abx/abx.sock")
    assert (s.pool_size, s.pool_templates, s.paused_stop_after) == (0, ("base",), 900.0)
    assert s.data_dir == builtin_data_dir()
    assert s.keys_file == s.data_dir / "gateway-keys.db"  # one data dir default for both
    assert (s.gateway_max_sandboxes, s.gateway_max_commands) == (50, 32)
    assert s.mcp_audit_log == Path.home() / ".abx" / "run" / "audit.log"
    assert s.mcp_auth_token is None and s.mcp_auth_token_file is None
    assert (s.mcp_output_budget, s.mcp_max_concurrency) == (102400, 32)
    assert s.log_level == "WARNING" and s.model_fields_set == set()


def test_environment_overrides(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {"ABX_DATA_DIR": str(tmp_path), "ABX_POOL_SIZE": " 3 ",
                        "ABX_POOL_TEMPLATES": "base, code-interpreter-v1,",
                        "ABX_ENGINE": "Daemon", "ABX_LOG_LEVEL": "debug",
                        "ABX_MCP_ALLOWED_ORIGINS": "https://a.example, *",
                        "ABX_GATEWAY_MAX_SANDBOXES": "7"}.items():
        clean_env.setenv(name, value)
    s = Settings()
    assert (s.data_dir, s.pool_size, s.engine, s.log_level) == (tmp_path, 3, "daemon", "DEBUG")
    assert s.pool_templates == ("base", "code-interpreter-v1")
    assert s.mcp_allowed_origins == ("https://a.example", "*")
    assert s.keys_file == tmp_path / "gateway-keys.db"
    assert KeyStore(settings=s).create("k")[0].max_sandboxes == 7


def test_blank_is_the_default_except_where_it_means_something(
        clean_env: pytest.MonkeyPatch) -> None:
    for name in ("ABX_DATA_DIR", "ABX_POOL_SIZE", "ABX_ENGINE", "ABX_MCP_TEMPLATE",
                 "ABX_MCP_AUDIT_LOG", "ABX_MCP_AUTH_TOKEN"):
        clean_env.setenv(name, "  ")
    s = Settings()
    assert (s.data_dir, s.pool_size, s.engine) == (builtin_data_dir(), 0, "auto")
    assert s.mcp_audit_log is None  # blank: auditing off
    assert s.mcp_auth_token == ""  # set but blank: every request refused
    assert AgentConfig.from_settings(s, "http").template == "base"


@pytest.mark.parametrize(("name", "value", "says"), [
    ("ABX_POOL_SIZE", "two", "valid integer"),
    ("ABX_POOL_SIZE", "-1", "greater than or equal to 0"),
    ("ABX_MCP_OUTPUT_BUDGET", "0", "greater than 0"),
    ("ABX_ENGINE", "kvm", "not one of embedded, rootless, daemon, remote"),
    ("ABX_PAUSED_STOP_AFTER", "soon", "valid number"),
    ("ABX_LOG_LEVEL", "loud", "'DEBUG'"),
])
def test_a_bad_value_is_an_error_naming_the_variable(
        clean_env: pytest.MonkeyPatch, name: str, value: str, says: str) -> None:
    clean_env.setenv(name, value)
    with pytest.raises(SettingsError) as err:
        Settings()
    assert err.value.message.startswith(f"invalid setting: {name}: ")
    assert says in err.value.message and repr(value.strip()) in err.value.message.lower()


def test_a_child_environment_carries_the_settings_exactly(clean_env: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    clean_env.setenv("ABX_MCP_AUTH_TOKEN_FILE", "/old/token")
    clean_env.setenv("ABX_MCP_AUDIT_LOG", "")
    clean_env.setenv("ABX_POOL_TEMPLATES", "a,b")
    parent = Settings().model_copy(update={"mcp_auth_token": "t0k", "mcp_auth_token_file": None,
                                           "data_dir": tmp_path})
    env = child_env(parent, {"PATH": "/bin", "ABX_MCP_AUTH_TOKEN_FILE": "/old/token"})
    assert env["PATH"] == "/bin" and "ABX_MCP_AUTH_TOKEN_FILE" not in env
    assert env["ABX_MCP_AUTH_TOKEN"] == "t0k" and env["ABX_MCP_AUDIT_LOG"] == ""
    for name in VARIABLES:
        clean_env.delenv(name, raising=False)
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert Settings() == parent


def test_engine_config_from_settings(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("ABX_DATA_DIR", str(tmp_path))
    config = EngineConfig.from_settings(Settings(pool_size=4), host_reserve_mb=10)
    assert (config.data_dir, config.pool_size, config.host_reserve_mb) == (tmp_path, 4, 10)
    assert EngineConfig() == EngineConfig.from_settings(Settings())  # no arguments: the env


def test_mcp_servers_keep_a_warm_pool_unless_told_otherwise(
        clean_env: pytest.MonkeyPatch) -> None:
    warm = with_warm_pool(Settings(), "code-interpreter-v1")
    assert (warm.pool_size, warm.pool_templates) == (2, ("code-interpreter-v1",))
    clean_env.setenv("ABX_POOL_SIZE", "0")
    assert with_warm_pool(Settings(), "base").pool_size == 0


def test_the_docs_table_is_the_model() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert with_table(doc) == doc, \
        ("docs/configuration.md is stale: "
         "python -m agent_sandbox.config.reference docs/configuration.md")


def test_every_variable_the_code_names_is_in_the_model() -> None:
    """A new ABX_ variable in the host code must be a setting (and so documented)."""
    named: set[str] = set()
    for path in (ROOT / "agent_sandbox").rglob("*.py"):
        if "guest" in path.parts or path.name == "deploy_files.py":  # read elsewhere
            continue
        named |= set(re.findall(r"\bABX_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    host_set_for_guest = {"ABX_GUEST_RLIMIT_AS", "ABX_GUEST_TOKEN"}
    assert named - host_set_for_guest - set(VARIABLES) == set()


def test_every_variable_the_docs_name_exists() -> None:
    """A variable named in the docs is a setting, or one the scripts read (a misspelled
    one, such as ABX_SANDBOX_URL for ABX_SANDBOX_BASE_URL, sends a reader nowhere)."""
    scripts = set()
    for path in (ROOT / "scripts").rglob("*.sh"):
        scripts |= set(re.findall(r"\$\{?(ABX_[A-Z0-9_]*[A-Z0-9])", path.read_text()))
    for path in (ROOT / "tests").rglob("*.py"):  # what the test run reads (ABX_TEST_*)
        scripts |= set(re.findall(r"environ(?:\.get\(|\[)\"(ABX_TEST_[A-Z0-9_]*)\"",
                                  path.read_text()))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        named = set(re.findall(r"\bABX_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
        assert named - set(VARIABLES) - scripts == set(), path.name
