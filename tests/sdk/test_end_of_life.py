"""A sandbox's end of life, as every surface asks for it (core.spec: ``lifetime``,
``on_timeout``, ``keep_volume``) and as the service's reaper carries it out on the real
backend, with the reason in the data dir's audit log. The reaper is run at a chosen time
(``reap_once(now=...)``): nothing here waits for a clock."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agent_sandbox import Sandbox, Volume
from agent_sandbox.core.errors import InvalidArgumentError, NotFoundError
from agent_sandbox.providers.local import local_provider

pytestmark = pytest.mark.integration


def _audit(sandbox_id: str) -> list[dict[str, Any]]:
    """The ends the service decided for this sandbox (the gateway's REST calls on it are
    in the same log)."""
    path = local_provider().config.audit_log
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines)
            if e.get("sandbox_id") == sandbox_id and e.get("event") == "sandbox.end"]


def _reap_at(later: float) -> None:
    """The reaper's pass ``later`` seconds from now (the gateway's engine shares the data
    dir: its sandboxes are this one's)."""
    local_provider().reap_once(now=time.time() + later)


def test_the_options_reach_the_sandbox_and_are_checked(provider_kind: str) -> None:
    with Sandbox.create(lifetime=600, on_timeout="kill", keep_volume=False) as sb:
        info = sb.info()
        assert (info.lifetime, info.on_timeout, info.keep_volume) == (600, "kill", False)
        assert info.ends_at == pytest.approx(info.created_at + 600)
    for bad, says in (({"lifetime": 0}, "lifetime must be greater than 0"),
                      ({"on_timeout": "stop"}, "on_timeout must be 'pause' or 'kill'"),
                      ({"keep_volume": "no"}, "keep_volume must be true or false")):
        with pytest.raises(InvalidArgumentError, match=says):
            Sandbox.create(**bad)


def test_a_lifetime_ends_it_and_keeps_the_volume(provider_kind: str) -> None:
    sb = Sandbox.create(lifetime=30)
    sb.files.write("/workspace/kept.txt", "still here")
    _reap_at(10)
    assert sb.info().state == "running"
    _reap_at(31)
    with pytest.raises(NotFoundError):
        sb.info()
    assert sb.volume_id in {v.volume_id for v in Volume.list()}  # kept, as asked
    (line,) = _audit(sb.sandbox_id)
    assert (line["event"], line["reason"], line["volume"]) == (
        "sandbox.end", "its lifetime is over", "kept")
    with Sandbox.create(volume=sb.volume_id) as again:  # its exit deletes the volume
        assert again.files.read("/workspace/kept.txt") == "still here"


def test_on_timeout_kill_ends_it_idle_and_deletes_the_volume_as_asked(
        provider_kind: str) -> None:
    sb = Sandbox.create(timeout=20, on_timeout="kill", keep_volume=False)
    _reap_at(21)
    with pytest.raises(NotFoundError):
        sb.info()
    assert sb.volume_id not in {v.volume_id for v in Volume.list()}
    (line,) = _audit(sb.sandbox_id)
    assert line["reason"] == "idle past its timeout (on_timeout: kill)"
    assert line["volume"] == "deleted"


def test_the_default_still_pauses() -> None:
    with Sandbox.create(timeout=20) as sb:
        _reap_at(21)
        assert sb.info().state == "paused"
        assert _audit(sb.sandbox_id) == []
