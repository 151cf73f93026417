"""Helpers of bench/mcp.py: the HTTP server under test and its CPU time."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx2 as httpx


def cpu_ms(pid: int) -> float:
    """User + system CPU time the process (all its threads) has used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def start_uvicorn(env: dict[str, str], root: str) -> tuple[subprocess.Popen[bytes], str]:
    """The HTTP MCP server of the checkout at ``root`` on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "agent_sandbox.agent.mcp_http:asgi_app", "--host",
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
