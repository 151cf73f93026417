"""E2B's pause, snapshots and fork through the real e2b SDK: a paused sandbox's processes
carry on after connect; create_snapshot, list_snapshots (all, or by name or id),
create(template=<snapshot>), fork(count=2) and delete_snapshot (docs/snapshots.md).
Skipped without CRIU."""

from __future__ import annotations

import pytest
from e2bgateway import E2BGateway
from snapshotting import memory_snapshots_missing

from agent_sandbox.providers.local import local_provider

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def _criu() -> None:
    if (why := memory_snapshots_missing(local_provider())) is not None:
        pytest.skip(why)


def test_pause_keeps_processes_and_snapshots_fork(e2b_env: E2BGateway) -> None:
    from e2b import Sandbox

    sb = Sandbox.create()
    made = []
    try:
        pid = sb.commands.run("sleep 1000", background=True).pid
        sb.files.write("/workspace/state.txt", "kept")
        sb.pause()
        sb = Sandbox.connect(sb.sandbox_id)
        assert sb.commands.run(f"kill -0 {pid} && echo alive").stdout == "alive\n"

        snap = sb.create_snapshot(name=f"kept-{sb.sandbox_id}")
        assert snap.snapshot_id in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
        for name in (f"kept-{sb.sandbox_id}", snap.snapshot_id):  # its name or its id
            assert [s.snapshot_id for s in Sandbox.list_snapshots(name=name).next_items()] \
                == [snap.snapshot_id]
        assert Sandbox.list_snapshots(name=f"kept-{sb.sandbox_id}-not").next_items() == []
        made.append(Sandbox.create(template=snap.snapshot_id))
        forks = sb.fork(count=2)
        assert not [f for f in forks if isinstance(f, Exception)], forks
        made += forks
        for copy in made:
            assert copy.files.read("/workspace/state.txt") == "kept"
            assert copy.commands.run(f"kill -0 {pid} && echo alive").stdout == "alive\n"
        assert sb.is_running()
        assert Sandbox.delete_snapshot(snap.snapshot_id) in (True, None)
        assert snap.snapshot_id not in [s.snapshot_id
                                        for s in Sandbox.list_snapshots().next_items()]
    finally:
        for copy in made:
            copy.kill()
        sb.kill()
