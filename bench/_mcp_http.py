"""Helpers of bench/mcp.py: the servers under test, their CPU time, their exit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx2 as httpx


def cpu_ms(pid: int) -> float:
    """User + system CPU time the process (all its threads) has used so far."""
    return sum(cpu_split_ms(pid))


def cpu_split_ms(pid: int) -> tuple[float, float]:
    """User and system CPU time the process (all its threads) has used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) * 1000 / tick, int(fields[12]) * 1000 / tick


def start_uvicorn(env: dict[str, str], root: str) -> tuple[subprocess.Popen[bytes], str]:
    """The HTTP MCP server of the checkout at ``root`` on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "agent_sandbox.surfaces.mcp.http_app:asgi_app", "--host",
         "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=root, env=env, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(base + "/health", timeout=1)
            break
        except httpx.TransportError:
            if proc.poll() is not None:
                raise RuntimeError("the MCP HTTP server exited at start") from None
            time.sleep(0.1)
    return proc, base + "/mcp"


def _live_children() -> list[int]:
    pids: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as fh:
            pids += [int(p) for p in fh.read().split()]
    live = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    live.append(pid)
        except FileNotFoundError:
            pass
    return live


def wait_children(timeout: float = 60) -> None:
    """Wait for the servers this process spawned to finish their own cleanup (a STDIO
    server goes on after its client has closed it: it destroys its sandboxes first)."""
    deadline = time.monotonic() + timeout
    while _live_children() and time.monotonic() < deadline:
        time.sleep(0.2)
