"""Run the real ``abx`` executable in a throwaway HOME and working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.surfaces.gateway.process import GatewayProcess

ABX = Path(sys.executable).parent / "abx"
# Settings a developer's shell may carry that would leak into the tests.
SCRUB = ("ABX_SANDBOX_API_KEY", "ABX_SANDBOX_BASE_URL", "SANDBOX_REGION", "ABX_DEFAULT_TEMPLATE",
         "ABX_MCP_TEMPLATE", "ABX_MCP_TOOLS", "ABX_MCP_AUTH_TOKEN", "ABX_MCP_AUTH_TOKEN_FILE",
         "ABX_MCP_RUNTIME_DIR", "XDG_CONFIG_HOME", "CODEX_HOME", "APPDATA")


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Abx:
    def __init__(self, home: Path, cwd: Path) -> None:
        self.home = home
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if k not in SCRUB}
        self.env.update(HOME=str(home), ABX_MCP_AUDIT_LOG="", COLUMNS="200", NO_COLOR="1")
        # The installed command, or the module where the venv has no script.
        self.command = ([str(ABX)] if ABX.exists()
                        else [sys.executable, "-m", "agent_sandbox.surfaces.cli"])

    def __call__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 90,
                 check: int | None = 0) -> Result:
        proc = subprocess.run([*self.command, *args], cwd=self.cwd,
                              env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        result = Result(proc.returncode, proc.stdout, proc.stderr)
        if check is not None:
            assert proc.returncode == check, (args, result)
        return result


@pytest.fixture
def abx(tmp_path: Path) -> Abx:
    home = tmp_path / "home"
    cwd = tmp_path / "project"
    home.mkdir()
    cwd.mkdir()
    return Abx(home, cwd)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    # Its own (empty) key file: open on loopback whatever keys other tests made.
    keys = tmp_path_factory.mktemp("gw-keys") / "keys.db"
    gw = GatewayProcess(keys_file=str(keys)).start()
    try:
        yield gw
    finally:
        gw.stop()
