"""The local MCP server's run record (``mcp-server.json``) and its process.

Standard library only at import (the ``abx mcp start`` launcher writes the record before it
execs the server); ``directory`` is the runtime dir when the caller already knows it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from agent_sandbox.surfaces.cli.atomic import atomic_write

RECORD = "mcp-server.json"
LOG = "mcp-server.log"
MARKERS = ("agent_sandbox.surfaces.mcp.http_app", "agent_sandbox.surfaces.mcp")


def runtime_dir() -> Path:
    from agent_sandbox.surfaces.cli.settings import cli_settings

    return cli_settings().mcp_runtime_dir


def ensure_runtime_dir(directory: Path | None = None) -> Path:
    path = directory or runtime_dir()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def record_path(directory: Path | None = None) -> Path:
    return (directory or runtime_dir()) / RECORD


def log_path() -> Path:
    return runtime_dir() / LOG


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): a pid reused later differs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_our_server(pid: int, ticks: int | None = None) -> bool:
    """``pid`` is alive, is an agent-sandbox MCP server, and (if known) started when recorded."""
    if pid <= 0:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state in ("Z", "X"):
        return False
    args = " ".join(cmdline(pid))
    if not any(marker in args for marker in MARKERS):
        return False
    return ticks is None or start_ticks(pid) == ticks


def read_record(directory: Path | None = None) -> dict[str, Any] | None:
    try:
        data = json.loads(record_path(directory).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


def running_record(directory: Path | None = None) -> dict[str, Any] | None:
    """The record, if the process it names is still our server."""
    rec = read_record(directory)
    if rec and is_our_server(rec["pid"], rec.get("start_ticks")):
        return rec
    return None


def write_record(pid: int, directory: Path | None = None, **fields: Any) -> Path:
    path = record_path(ensure_runtime_dir(directory))
    data = {"pid": pid, "start_ticks": start_ticks(pid), "started_at": time.time(), **fields}
    atomic_write(path, (json.dumps(data, indent=2) + "\n").encode(), mode=0o600,
                 force_mode=True)
    return path


def remove_record() -> None:
    with contextlib.suppress(FileNotFoundError):
        record_path().unlink()


def wait_gone(pid: int, ticks: int | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # reap, if it is our child
        if not is_our_server(pid, ticks):
            return True
        time.sleep(0.1)
    return not is_our_server(pid, ticks)
