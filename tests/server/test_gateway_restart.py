"""The gateway dies (kill -9) and comes back while a sandbox runs a background command:
the client reconnects by itself, /workspace is intact, the command never stopped."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from _gw import Gateway

from agent_sandbox.remote import RemoteProvider
from agent_sandbox.surfaces.gateway.process import GatewayProcess

pytestmark = pytest.mark.integration


def _ticks(provider: RemoteProvider, sandbox_id: str) -> int:
    data = b"".join(provider.read_file(sandbox_id, "/workspace/ticks"))
    return len(data.splitlines())


def test_kill_9_and_restart_while_a_background_command_runs(gw: Gateway) -> None:
    proc = GatewayProcess(keys_file=str(gw.keys.path)).start()
    provider = RemoteProvider(proc.url, gw.tokens["a"], retry_seconds=60)
    info = provider.create()
    sid = info.sandbox_id
    try:
        provider.write_file(sid, "/workspace/kept.txt", "survives the gateway")
        pid = provider.start(sid, "while :; do echo t >> /workspace/ticks; sleep 0.1; done")
        time.sleep(0.5)

        for sig in (signal.SIGKILL, signal.SIGTERM):
            proc.kill(sig)
            before = time.monotonic()
            # Back in 1.5 s; meanwhile the client's calls wait and retry, then go through.
            restart = threading.Timer(1.5, proc.start)
            restart.start()
            try:
                assert provider.info(sid).state == "running"
            finally:
                restart.join()
            assert time.monotonic() - before >= 1.0

            assert b"".join(provider.read_file(sid, "/workspace/kept.txt")) == \
                b"survives the gateway"
            out = provider.process_output(sid, pid)
            assert out.running, "the background command died with the gateway"
            first = _ticks(provider, sid)
            time.sleep(0.5)
            assert _ticks(provider, sid) > first  # and it is still making progress
            # New, non-idempotent calls work on the new process too.
            assert provider.run(sid, "echo ok").stdout == "ok\n"
        assert provider.kill_process(sid, pid)
    finally:
        provider.kill(sid, delete_volume=True)
        proc.stop()
