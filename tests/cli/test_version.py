"""One version, one distribution name: pyproject reads ``agent_sandbox.__version__``, and
``abx --version`` prints it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from conftest import Abx

import agent_sandbox
from agent_sandbox.cli import wheel

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_pyproject_takes_the_version_from_the_package() -> None:
    project = tomllib.loads(PYPROJECT.read_text())
    assert project["project"]["name"] == agent_sandbox.DISTRIBUTION == "abx-sandbox"
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "agent_sandbox.__version__"}
    assert project["project"]["scripts"] == {"abx": "agent_sandbox.cli.main:main"}
    assert wheel.wheel_name() == f"abx_sandbox-{agent_sandbox.__version__}-py3-none-any.whl"


def test_abx_version(abx: Abx) -> None:
    assert abx("--version").out == f"abx {agent_sandbox.__version__}\n"
