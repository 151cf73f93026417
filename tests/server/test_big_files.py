"""A 1 GiB file through the gateway, up and back down, with bounded memory on both ends.

The gateway is a fresh process of its own, so its peak RSS (VmHWM) is this transfer's
alone; the client is a subprocess too (this file, run as a script), for the same reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _peak_rss import reset_peak, status_kb

SIZE = 1 << 30
CHUNK = 1 << 20
MAX_GROWTH_MB = 200  # far below the file's 1024 MiB: nothing holds it whole
PATH = "/workspace/big.bin"
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_one_gib_up_and_down_with_bounded_memory() -> None:
    from agent_sandbox.remote import RemoteProvider
    from agent_sandbox.surfaces.gateway.process import GatewayProcess
    from agent_sandbox.surfaces.http.keys import KeyStore

    keys_file = Path(tempfile.mkdtemp(prefix="abx-big-keys-")) / "keys.db"
    _, token = KeyStore(keys_file).create("big", max_sandboxes=1)
    gateway = GatewayProcess(keys_file=str(keys_file)).start()
    provider = RemoteProvider(gateway.url, token)
    assert gateway.proc is not None
    pid = gateway.proc.pid
    try:
        sid = provider.create(disk_mb=2048).sandbox_id  # room for 1 GiB and its temp copy
        try:
            provider.write_file(sid, "/workspace/warm", b"x")  # routes and threads warmed
            base_kb = reset_peak(pid)
            started = time.monotonic()
            out = subprocess.run([sys.executable, __file__, gateway.url, token, sid],
                                 capture_output=True, text=True, timeout=300)
            took = time.monotonic() - started
            assert out.returncode == 0, out.stderr[-3000:]
            client = json.loads(out.stdout)
            gateway_growth_mb = (status_kb(pid, "VmHWM") - base_kb) / 1024
            inside = provider.run(sid, f"sha256sum {PATH}", timeout=60).stdout.split()[0]
        finally:
            provider.kill(sid, delete_volume=True)
    finally:
        provider.close()
        gateway.stop()
    print(f"\n1 GiB: up {client['up_s']:.1f} s, down {client['down_s']:.1f} s "
          f"(all {took:.1f} s); peak RSS growth: gateway {gateway_growth_mb:.0f} MiB, "
          f"client {client['growth_mb']:.0f} MiB")
    assert client["written"] == SIZE and client["read"] == SIZE
    assert client["sha_down"] == client["sha_up"] == inside
    assert gateway_growth_mb < MAX_GROWTH_MB, gateway_growth_mb
    assert client["growth_mb"] < MAX_GROWTH_MB, client


# The client side, run as ``python test_big_files.py URL TOKEN SANDBOX_ID``: it prints one
# JSON object (sizes, digests, times, its own peak RSS growth).

def _generated(digest: hashlib._Hash) -> Iterator[bytes]:
    """1 GiB made chunk by chunk as the upload pulls it (never held whole): one random
    block, each copy stamped with its index, so a lost or reordered chunk shows in the
    digest (os.urandom for all of it would cost seconds of CPU)."""
    block = os.urandom(CHUNK)
    for i in range(SIZE // CHUNK):
        chunk = i.to_bytes(8, "big") + block[8:]
        digest.update(chunk)
        yield chunk


def _client(url: str, token: str, sandbox_id: str) -> dict[str, object]:
    from agent_sandbox import Sandbox
    from agent_sandbox.remote import RemoteProvider

    sb = Sandbox.connect(sandbox_id, provider=RemoteProvider(url, token))
    base_kb = reset_peak("self")
    up = hashlib.sha256()
    t0 = time.monotonic()
    written = sb.files.write(PATH, _generated(up))
    t1 = time.monotonic()
    down = hashlib.sha256()
    read = 0
    for chunk in sb.files.read(PATH, format="stream"):
        down.update(chunk)
        read += len(chunk)
    t2 = time.monotonic()
    return {"written": written, "read": read, "sha_up": up.hexdigest(),
            "sha_down": down.hexdigest(), "up_s": t1 - t0, "down_s": t2 - t1,
            "growth_mb": (status_kb("self", "VmHWM") - base_kb) / 1024}


if __name__ == "__main__":
    print(json.dumps(_client(*sys.argv[1:4])))
