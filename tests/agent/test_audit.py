"""The audit log: private JSON lines, rotated by size, and off when there is no path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_sandbox.core import audit
from agent_sandbox.core.audit import AuditLog


def test_lines_are_private_json_and_rotate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.setattr(audit, "MAX_BYTES", 400)
    path = tmp_path / "run" / "audit.log"
    log = AuditLog(path)
    for i in range(60):
        log.record(trace_id=f"t{i}", tool="run_command", status="ok", input_bytes=i)
    assert log.enabled
    log.close()
    assert not log.enabled
    log.record(trace_id="after-close")  # ignored, not an error
    files = sorted(tmp_path.joinpath("run").iterdir())
    assert [f.name for f in files] == ["audit.log"] + [f"audit.log.{n}" for n in range(1, 6)]
    seen = []
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o600
        assert f.stat().st_size <= 400
        seen += [json.loads(line)["trace_id"] for line in f.read_text().splitlines()]
    assert "t59" in seen and "t0" not in seen  # the oldest went with the 6th file
    assert all(set(json.loads(line)) >= {"time", "trace_id", "tool"}
               for line in path.read_text().splitlines())


def test_no_path_means_no_audit(tmp_path: Path) -> None:
    log = AuditLog(None)
    assert not log.enabled
    log.record(trace_id="x")
    log.close()
    assert not list(tmp_path.iterdir())


def test_trace_ids_are_unique_hex_and_a_forked_child_makes_its_own() -> None:
    import os

    from agent_sandbox.surfaces.mcp.server import new_trace_id

    ids = [new_trace_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: same counter position, but a new prefix
        os.write(write, new_trace_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    mine = new_trace_id()
    assert len(child) == 32 and child[:16] != mine[:16]
