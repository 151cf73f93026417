"""``abx config`` and the resolution order: environment > ./.env > ~/.abx/config."""

from __future__ import annotations

import stat

import pytest
from conftest import Abx

pytestmark = pytest.mark.integration

KEY = "sk-config-0123456789abcdef"


def test_set_get_list_unset(abx: Abx) -> None:
    abx("config", "set", "sandbox_api_key", KEY)
    abx("config", "set", "region", "cn-hangzhou")
    path = abx.home / ".abx" / "config"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert abx("config", "get", "region").out.strip() == "cn-hangzhou"
    listed = abx("config", "list").out + abx("config", "list", "--json").out
    assert KEY not in listed and "cn-hangzhou" in listed  # secrets masked
    abx("config", "unset", "region")
    assert abx("config", "get", "region", check=1).out == ""
    assert abx("config", "set", "colour", "blue", check=2).err.startswith("error: unknown key")


def test_resolution_from_abx_config(abx: Abx) -> None:
    abx("config", "set", "sandbox_api_key", "from-file")
    got = abx("config", "get", "sandbox_api_key", "--json", "--reveal").json()
    assert (got["value"], got["source"]) == ("from-file", "config")


def test_resolution_dotenv_beats_abx_config(abx: Abx) -> None:
    abx("config", "set", "sandbox_api_key", "from-file")
    (abx.cwd / ".env").write_text('# local\nexport ABX_SANDBOX_API_KEY="from-dotenv"\n')
    got = abx("config", "get", "sandbox_api_key", "--json", "--reveal").json()
    assert (got["value"], got["source"]) == ("from-dotenv", "dotenv")


def test_resolution_env_beats_dotenv_and_abx_config(abx: Abx) -> None:
    abx("config", "set", "sandbox_api_key", "from-file")
    (abx.cwd / ".env").write_text("ABX_SANDBOX_API_KEY=from-dotenv\n")
    got = abx("--json", "config", "get", "sandbox_api_key", "--reveal",
              env={"ABX_SANDBOX_API_KEY": "from-env"}).json()
    assert (got["value"], got["source"]) == ("from-env", "env")


def test_a_secret_is_masked_unless_revealed(abx: Abx) -> None:
    abx("config", "set", "sandbox_api_key", "sk-verysecretvalue123")
    for extra in ((), ("--json",)):
        out = abx("config", "get", "sandbox_api_key", *extra).out
        assert "verysecretvalue" not in out, out
    got = abx("config", "get", "sandbox_api_key", "--json").json()
    assert got["masked"] is True and got["source"] == "config"
    revealed = abx("config", "get", "sandbox_api_key", "--reveal").out
    assert revealed.strip() == "sk-verysecretvalue123"
