"""Snapshots through the gateway: a snapshot is its key's (another key gets a 404 for it,
its list and its forks), an admin sees every one with its owner; the memory backend
refuses snapshots with the reason."""

from __future__ import annotations

import pytest
from _gw import Gateway
from snapshotting import memory_snapshots_missing

from agent_sandbox.core.errors import NotFoundError, RuntimeUnavailableError
from agent_sandbox.providers.local import local_provider

pytestmark = pytest.mark.integration


def test_the_memory_backend_refuses_snapshots_clearly(gw_memory: Gateway) -> None:
    a = gw_memory.provider("a")
    sandbox_id = a.create().sandbox_id
    try:
        with pytest.raises(RuntimeUnavailableError, match="runc engine with CRIU"):
            a.snapshot(sandbox_id)
        assert a.list_snapshots() == []
        with pytest.raises(NotFoundError):
            a.create(snapshot="snap-0123456789")
        reply = gw_memory.http("a").post(f"/v1/sandboxes/{sandbox_id}/snapshots",
                                         json={"name": "x" * 65})
        assert reply.status_code == 422 or reply.status_code == 400, reply.text
    finally:
        a.kill(sandbox_id)


def test_a_snapshot_is_its_keys(gw: Gateway) -> None:
    if (why := memory_snapshots_missing(local_provider())) is not None:
        pytest.skip(why)
    a, b, admin = gw.provider("a"), gw.provider("b"), gw.provider("admin")
    sandbox_id = a.create().sandbox_id
    fork = None
    try:
        snap = a.snapshot(sandbox_id, "mine")
        assert snap.owner and a.snapshot_info(snap.snapshot_id).name == "mine"
        assert [s.snapshot_id for s in a.list_snapshots()] == [snap.snapshot_id]
        assert snap.snapshot_id not in {s.snapshot_id for s in b.list_snapshots()}
        for attempt in (lambda: b.snapshot_info(snap.snapshot_id),
                        lambda: b.delete_snapshot(snap.snapshot_id),
                        lambda: b.create(snapshot=snap.snapshot_id),
                        lambda: b.snapshot(sandbox_id)):
            with pytest.raises(NotFoundError):
                attempt()
        owners = {s.snapshot_id: s.owner for s in admin.list_snapshots()}
        assert owners[snap.snapshot_id] == snap.owner
        fork = a.create(snapshot=snap.snapshot_id)
        assert fork.owner == snap.owner and fork.template == "base"
        assert a.run(fork.sandbox_id, "echo ok").stdout == "ok\n"
        a.delete_snapshot(snap.snapshot_id)
        with pytest.raises(NotFoundError):
            a.snapshot_info(snap.snapshot_id)
    finally:
        if fork is not None:
            a.kill(fork.sandbox_id, delete_volume=True)
        a.kill(sandbox_id, delete_volume=True)
