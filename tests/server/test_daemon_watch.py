"""files.watch_dir and volumes through the local daemon (``abx serve --unix``): the SDK
over a unix socket, where stopping a watch shuts that socket's connection down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from agent_sandbox import Sandbox, Volume
from agent_sandbox.remote import RemoteProvider

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def daemon_url() -> Iterator[str]:
    folder = Path(tempfile.mkdtemp(prefix="abx-daemon-watch-", dir="/tmp"))
    sock = str(folder / "abx.sock")
    env = {k: v for k, v in os.environ.items() if k not in ("ABX_SANDBOX_BASE_URL",
                                                            "ABX_ENGINE")}
    proc = subprocess.Popen([sys.executable, "-m", "agent_sandbox.surfaces.cli", "serve", "--unix",
                             sock, "--api-keys-file", str(folder / "keys.db")], env=env,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                with httpx.Client(transport=httpx.HTTPTransport(uds=sock)) as c:
                    if c.get("http://abx/health").status_code == 200:
                        break
            except httpx.TransportError:
                time.sleep(0.1)
        yield f"unix://{sock}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_watch_and_volumes_over_the_daemon_socket(daemon_url: str) -> None:
    provider = RemoteProvider(daemon_url)
    sb = Sandbox.create(provider=provider)
    try:
        for _ in range(2):  # 16 watches fill the sandbox; stopped ones free their slots
            handles = [sb.files.watch_dir("/workspace") for _ in range(16)]
            sb.commands.run("touch /workspace/made")
            for handle in handles:
                event = handle.next_event(10)
                assert event is not None and (event.type, event.name) == ("create", "made")
                handle.stop()
                assert handle.ended == "stopped"
            sb.commands.run("rm /workspace/made")
            deadline = time.monotonic() + 10
            while True:  # the daemon sees each connection go, then the guest does
                try:
                    sb.files.watch_dir("/workspace", timeout=0.1).stop()
                    break
                except Exception:  # noqa: BLE001 - ResourceExhaustedError until freed
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
    finally:
        sb.kill()
    try:
        assert Volume.inspect(sb.volume_id, provider=provider).owner == "uid-0"
    finally:
        Volume.delete(sb.volume_id, provider=provider)
