"""A sandbox's trail: the engine's log (REST calls, ends) and the MCP servers' log (tool
calls) merged by time, this sandbox's records only, read from each file's tail and never
through a symlink."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from agent_sandbox.core.audit import AuditLog
from agent_sandbox.surfaces.console import audit


class _Engine:
    def __init__(self, path: Path) -> None:
        self.audit = AuditLog(path)


def test_the_trail_merges_both_logs_for_one_sandbox(tmp_path: Path, monkeypatch) -> None:
    engine = _Engine(tmp_path / "engine.log")
    mcp = AuditLog(tmp_path / "mcp.log")
    mcp.record(tool="run_command", sandbox_id="sbx-aaaaaaaaaa", status="ok")
    time.sleep(0.01)  # records are stamped to the millisecond
    engine.audit.record(event="rest.call", method="GET", route="/files",
                        sandbox_id="sbx-aaaaaaaaaa")
    engine.audit.record(event="rest.call", method="GET", route="/files",
                        sandbox_id="sbx-bbbbbbbbbb")
    with open(tmp_path / "mcp.log", "a") as f:
        f.write("not json\n" + json.dumps({"sandbox_id": "sbx-aaaaaaaaaa"})[:-3] + "\n")
    trail = audit.sandbox_trail(engine, "sbx-aaaaaaaaaa", tmp_path / "mcp.log")
    assert [e.get("tool") or e.get("route") for e in trail] == ["run_command", "/files"]
    monkeypatch.setattr(audit, "TAIL_BYTES", 10)  # only the tail is read
    assert audit.sandbox_trail(engine, "sbx-aaaaaaaaaa", tmp_path / "mcp.log") == []


def test_a_log_swapped_for_a_symlink_or_a_fifo_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"sandbox_id": "sbx-aaaaaaaaaa", "secret": 1}) + "\n")
    (tmp_path / "mcp.log").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo.log")
    engine = _Engine(tmp_path / "engine.log")
    assert audit.sandbox_trail(engine, "sbx-aaaaaaaaaa", tmp_path / "mcp.log") == []
    assert audit.sandbox_trail(engine, "sbx-aaaaaaaaaa", tmp_path / "fifo.log") == []
