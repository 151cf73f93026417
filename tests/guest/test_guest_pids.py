"""The guest outlives its sandbox's pids limit: a connection it has no thread for is
refused, and it serves again once pids are free (found in a Pod, whose readiness probe
connects every second: a fork bomb used to end the guest, and with it the Pod)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox.runtime.guest_client import GuestClient

AGENT = Path(__file__).resolve().parents[2] / "agent_sandbox" / "guest" / "agent.py"


def _pids_parent() -> Path | None:
    """Where this host lets root make a pids cgroup (v1 hierarchy or v2 root)."""
    if os.geteuid() != 0:
        return None
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").is_file():
        return v1
    v2 = Path("/sys/fs/cgroup")
    try:
        if "pids" in (v2 / "cgroup.subtree_control").read_text().split():
            return v2
    except OSError:
        pass
    return None


@pytest.fixture
def pids_cgroup() -> Iterator[Path]:
    parent = _pids_parent()
    if parent is None:
        pytest.skip("needs root and a pids cgroup controller to limit the guest's threads")
    group = parent / f"abx-test-guest-{secrets.token_hex(4)}"
    group.mkdir()
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        for _ in range(100):
            try:
                group.rmdir()
                break
            except OSError:  # its processes are still exiting
                time.sleep(0.05)


def test_guest_survives_having_no_thread_for_a_connection(pids_cgroup: Path,
                                                          tmp_path: Path) -> None:
    sock = str(tmp_path / "g.sock")
    # Joins the cgroup before it execs the guest: every thread it makes is counted there.
    proc = subprocess.Popen(
        ["sh", "-c", f'echo $$ > {pids_cgroup}/cgroup.procs && exec "$0" -I -S "$1" --unix "$2"',
         sys.executable, str(AGENT), sock], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("abx-guest ready")
        client = GuestClient(sock)
        client.ping_within(5.0)
        # Not one more task (a limit below the count stops new ones only): the next
        # connection's thread cannot start.
        (pids_cgroup / "pids.max").write_text("1")
        for _ in range(3):
            with pytest.raises(Exception):  # noqa: B017 - refused, however it shows
                GuestClient(sock, connect_timeout=2.0).ping_within(2.0)
        assert proc.poll() is None, "the guest ended when it had no thread to give"
        (pids_cgroup / "pids.max").write_text("max")
        client.ping_within(5.0)
    finally:
        proc.kill()
        proc.wait()
