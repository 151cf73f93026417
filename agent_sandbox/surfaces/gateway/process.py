"""A gateway as a child process, for tests and benchmarks (and a supervisor's restart)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx2 as httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GatewayProcess:
    """``python -m agent_sandbox.surfaces.gateway serve`` on loopback, with the caller's env
    (ABX_DATA_DIR included, so it shares the caller's engine state)."""

    def __init__(self, port: int | None = None, keys_file: str | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.keys_file = keys_file
        self.env = {**os.environ, **(extra_env or {})}
        # The gateway is the engine here: it must not itself point at a gateway.
        self.env.pop("ABX_SANDBOX_BASE_URL", None)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> GatewayProcess:
        args = [sys.executable, "-m", "agent_sandbox.surfaces.gateway", "serve",
                "--host", "127.0.0.1", "--port", str(self.port)]
        if self.keys_file:
            args += ["--api-keys-file", self.keys_file]
        self.proc = subprocess.Popen(args, env=self.env, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("gateway did not answer /health in time")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
