"""Shared helpers for the MCP server tests: spawning the server, raw JSON-RPC over pipes."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from typing import Any

import httpx2 as httpx
from mcp.client.stdio import StdioServerParameters

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def server_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)  # carries ABX_DATA_DIR from tests/conftest.py
    env.setdefault("ABX_MCP_AUDIT_LOG", "")
    env.update(extra)
    return env


def stdio_params(**extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "agent_sandbox.surfaces.mcp"],
                                 env=server_env(**extra), cwd=ROOT)


class RawServer:
    """The STDIO server as a subprocess we write bytes to ourselves."""

    def __init__(self, **extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent_sandbox.surfaces.mcp"], cwd=ROOT, env=server_env(**extra),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._buf = b""

    def send_bytes(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, msg: dict[str, Any]) -> None:
        self.send_bytes(json.dumps(msg).encode() + b"\n")

    def request(self, msg_id: int, method: str, params: dict[str, Any] | None = None) -> None:
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params or {}})

    def recv(self, timeout: float = 30) -> dict[str, Any]:
        return json.loads(self.recv_line(timeout))

    def recv_line(self, timeout: float = 30) -> bytes:
        """One line from the server, as sent."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no message from the server")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError("server closed stdout")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def initialize(self, version: str = "2025-06-18") -> dict[str, Any]:
        self.request(0, "initialize", {"protocolVersion": version, "capabilities": {},
                                       "clientInfo": {"name": "raw", "version": "1"}})
        reply = self.recv()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply

    def close(self) -> int:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            return self.proc.wait(20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def sandbox_ids() -> set[str]:
    from agent_sandbox import Sandbox

    return {i.sandbox_id for i in Sandbox.list()}


def wait_gone(ids: set[str], timeout: float = 10) -> set[str]:
    """Wait until none of ``ids`` exists; returns the ones still there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = ids & sandbox_ids()
        if not left:
            return set()
        time.sleep(0.2)
    return ids & sandbox_ids()


def kill_quietly(sandbox_id: str) -> None:
    from agent_sandbox import Sandbox

    try:
        Sandbox.connect(sandbox_id).kill(delete_volume=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


class Uvicorn:
    def __init__(self, host: str = "127.0.0.1", **env: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "agent_sandbox.surfaces.mcp.http_app:asgi_app",
             "--host", host, "--port", str(self.port), "--log-level", "warning"],
            cwd=ROOT, env=server_env(**env), stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/health", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("uvicorn did not start")

    def stop(self) -> str:
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err
