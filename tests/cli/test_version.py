"""One version, one distribution name: pyproject reads ``agent_sandbox.__version__``, and
``abx --version`` prints it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import Abx

import agent_sandbox
from agent_sandbox.surfaces.cli import wheel

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_pyproject_takes_the_version_from_the_package() -> None:
    project = tomllib.loads(PYPROJECT.read_text())
    assert project["project"]["name"] == agent_sandbox.DISTRIBUTION == "abx-sandbox"
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "agent_sandbox.__version__"}
    assert project["project"]["scripts"] == {"abx": "agent_sandbox.surfaces.cli.main:main"}
    assert wheel.wheel_name() == f"abx_sandbox-{agent_sandbox.__version__}-py3-none-any.whl"


def test_abx_version(abx: Abx) -> None:
    assert abx("--version").out == f"abx {agent_sandbox.__version__}\n"


def test_the_build_warns_of_nothing(tmp_path: Path) -> None:
    """Building the wheel (as `pip install -e .` and `abx mcp deploy` do) prints no
    deprecation of ours: the license table form setuptools drops in 2027 printed ~40
    lines in setup.sh. pip's own notes about this machine's index options are not ours."""
    src = tmp_path / "src"
    src.mkdir()
    for name in wheel.SOURCE_FILES:
        shutil.copy2(PYPROJECT.parent / name, src / name)
    shutil.copytree(wheel.PACKAGE_DIR, src / "agent_sandbox",
                    ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w",
                           str(tmp_path / "dist"), str(src)], capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and "setuptools" in out and "satisfies the requirement" in out:
        pytest.skip("the package index is unreachable: no setuptools to build with")
    assert proc.returncode == 0, out
    ours = [line for line in out.splitlines() if re.search(r"warning|deprecat", line, re.I)
            and not re.match(r"WARNING: Location '.*' is ignored", line)]
    assert ours == [], "\n".join(ours)
    project = tomllib.loads(PYPROJECT.read_text())
    assert f"setuptools>={wheel.SETUPTOOLS_MIN}" in project["build-system"]["requires"][0]
