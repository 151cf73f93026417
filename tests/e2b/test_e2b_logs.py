"""A sandbox's log: E2B's ``GET /sandboxes/{id}/logs`` and ``/v2/sandboxes/{id}/logs``
through the e2b SDK's own API client (its ``Sandbox`` has no method for them), our REST
API through our SDK (``Sandbox.get_logs``) and ``abx sandbox logs``: one log, kept by the
gateway (``service/sandbox_logs.py``). Key B gets 404 for key A's sandbox's log. (A
start command's output in the log, bounded: tests/service/test_memory_backend.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from e2bgateway import E2BGateway

pytestmark = pytest.mark.integration


def _api(gateway: E2BGateway, who: str) -> Any:
    from e2b.api.client_sync import get_api_client
    from e2b.connection_config import ConnectionConfig

    return get_api_client(ConnectionConfig(api_key=gateway.keys[who], api_url=gateway.url))


def test_logs_through_e2b_and_ours(e2b_gateway: E2BGateway, e2b_sandbox: Any) -> None:
    from e2b.api.client.api.sandboxes import get_sandboxes_sandbox_id_logs as v1
    from e2b.api.client.api.sandboxes import get_v_2_sandboxes_sandbox_id_logs as v2
    from e2b.api.client.models.log_level import LogLevel
    from e2b.api.client.models.logs_direction import LogsDirection

    from agent_sandbox.remote.provider import RemoteProvider
    from agent_sandbox.sdk import Sandbox

    sid = e2b_sandbox.sandbox_id
    e2b_sandbox.set_timeout(120)
    e2b_sandbox.pause()
    e2b_sandbox.connect()

    a = _api(e2b_gateway, "a")
    found = v2.sync_detailed(sid, client=a)
    assert found.status_code == 200, found.content
    messages = [e.message for e in found.parsed.logs]
    assert messages[0].startswith("created from template base")
    assert messages[1:] == ["idle timeout set to 120 s", "paused", "resumed"]
    assert {e.level for e in found.parsed.logs} == {LogLevel.INFO}
    back = v2.sync_detailed(sid, client=a, direction=LogsDirection.BACKWARD, limit=2,
                            search="e")
    assert [e.message for e in back.parsed.logs] == ["resumed", "paused"]
    assert v2.sync_detailed(sid, client=a, level=LogLevel.ERROR).parsed.logs == []
    old = v1.sync_detailed(sid, client=a)
    assert old.status_code == 200
    assert [line.line for line in old.parsed.logs] == messages
    assert [e.message for e in old.parsed.log_entries] == messages

    # Tenancy: another key's sandbox is not found, as everywhere.
    b = _api(e2b_gateway, "b")
    assert v2.sync_detailed(sid, client=b).status_code == 404
    assert v1.sync_detailed(sid, client=b).status_code == 404

    ours = Sandbox.connect(sid, RemoteProvider(e2b_gateway.url, e2b_gateway.keys["a"]))
    assert [e.message for e in ours.get_logs()] == messages
    shown = subprocess.run(
        [sys.executable, "-m", "agent_sandbox.surfaces.cli", "sandbox", "logs", sid],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "ABX_SANDBOX_BASE_URL": e2b_gateway.url,
             "ABX_SANDBOX_API_KEY": e2b_gateway.keys["a"]})
    assert shown.returncode == 0, shown.stderr
    assert [line.split(None, 3)[3] for line in shown.stdout.splitlines()] == messages
