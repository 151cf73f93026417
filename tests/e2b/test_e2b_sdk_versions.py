"""The oldest E2B Python SDKs of the range we support (docs/e2b.md), in a venv of their
own, running unmodified user code against the gateway. e2b 2.26.0 / e2b-code-interpreter
2.9.0 are the first that send every request to one URL (E2B_SANDBOX_URL; the code
interpreter from 2.9.0), and their Connect client is another one than the newest's
(e2b_connect on google protobuf, not connectrpc on protobuf-py). The newest is what the
rest of tests/e2b runs in-process."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from e2bgateway import E2BGateway
from pipcache import python_with

pytestmark = pytest.mark.integration
OLDEST = ["e2b==2.26.0", "e2b-code-interpreter==2.9.0"]


def test_oldest_supported_python_sdk(e2b_gateway: E2BGateway, code_template: str) -> None:
    python = python_with("e2b-2.26.0", OLDEST)
    script = Path(__file__).parent / "py" / "e2b_flow.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON"))}
    done = subprocess.run([str(python), str(script)], env={**env, **e2b_gateway.env("a")},
                          capture_output=True, text=True, timeout=300)
    steps = {s["step"]: s for s in map(json.loads, done.stdout.splitlines())}
    failed = {k: v["error"] for k, v in steps.items() if not v["ok"]}
    assert not failed, (failed, done.stderr[-2000:])
    assert steps["run"]["out"] == "hi\n"
    assert steps["stream"]["out"] == "1\n2\n3\n"
    assert steps["exit"]["out"] == 3
    assert steps["background"]["out"] == "done\n"
    assert steps["write_read"]["out"] == "hello"
    assert "x.txt" in steps["list"]["out"] and steps["exists"]["out"] is True
    assert steps["run_code"]["out"] == "42"
    assert steps["code_error"]["out"] == "ZeroDivisionError"
