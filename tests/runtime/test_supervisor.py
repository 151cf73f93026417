"""The lifecycle supervisor keeps the idle-timeout promise with no engine process alive.

Each test has a data dir of its own, so no engine of this test process (nor its reaper
thread) serves it: whatever pauses, stops or cleans up there is the supervisor. It is
looked at without starting anything: an engine built with ``reaper=False`` (no booting
call), runc itself, the store.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.backends.runc import supervisor
from agent_sandbox.backends.runc.runc import Runc
from agent_sandbox.backends.runc.store import Store
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core.states import SandboxState
from agent_sandbox.providers.local import embedded_service

CHILD = str(Path(__file__).with_name("_durability_child.py"))
ROOT = str(Path(__file__).resolve().parent.parent.parent)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    data = Path(tempfile.mkdtemp(prefix="abx-sup-", dir="/var/tmp"))
    os.chmod(data, 0o711)
    try:
        yield data
    finally:
        if (data / "state.db").exists():
            engine = embedded_service(EngineConfig(data_dir=data, pool_size=0), reaper=False)
            for row in engine.backend.store.list_sandboxes():
                engine.kill(row.id, delete_volume=True)
            assert supervisor.stop(data), "the supervisor did not stop"
            engine.close()
            engine.backend.release_host_mounts()
        shutil.rmtree(data, ignore_errors=True)


def _env(data: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ABX_SANDBOX_BASE_URL",)}
    env.update(ABX_DATA_DIR=str(data), ABX_ENGINE="embedded", ABX_POOL_SIZE="0",
               PYTHONPATH=ROOT, NO_COLOR="1", **extra)
    return env


def _abx(data: Path, *args: str, **extra: str) -> Any:
    proc = subprocess.run([sys.executable, "-m", "agent_sandbox.surfaces.cli", *args, "--json"],
                          env=_env(data, **extra), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, cwd="/")
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr[-3000:])
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def _wait(what: str, ready: Callable[[], bool], within: float) -> None:
    deadline = time.monotonic() + within
    while not ready():
        assert time.monotonic() < deadline, f"not within {within:.0f} s: {what}"
        time.sleep(0.2)


def _states(data: Path) -> dict[str, str]:
    return {s["sandbox_id"]: s["state"] for s in _abx(data, "sandbox", "list")}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


@pytest.mark.integration
def test_a_cli_sandbox_is_paused_stopped_and_left_with_no_process_alive(data_dir: Path
                                                                         ) -> None:
    created = _abx(data_dir, "sandbox", "create", "--timeout", "3",
                   ABX_PAUSED_STOP_AFTER="3")
    sandbox_id = created["sandbox_id"]
    assert created["state"] == "running"
    assert supervisor.status(data_dir).running  # from the moment it is started
    _wait("the supervisor starts", lambda: supervisor.status(data_dir).pid > 0, 10)
    running = supervisor.status(data_dir)
    assert running.running and running.pid and time.time() - running.since < 60
    # Detached: not the CLI's (gone) nor this process's child, in a session of its own.
    assert os.getsid(running.pid) != os.getsid(0)
    assert (data_dir / supervisor.LOG_NAME).stat().st_mode & 0o777 == 0o600

    _wait("auto-pause", lambda: _states(data_dir) == {sandbox_id: "paused"}, 10)
    runc = Runc(data_dir / "runc")
    _wait("the long-paused container stopped", lambda: runc.state(sandbox_id) is None, 15)
    # Paused with no container left: nothing can time out, so it exits.
    _wait("the supervisor exits", lambda: not supervisor.status(data_dir).running,
          supervisor.LINGER + 15)
    _wait("its process ends", lambda: not _pid_alive(running.pid), 10)
    assert _states(data_dir) == {sandbox_id: "paused"}

    # A resume starts one again (the fresh container can go idle again).
    out = subprocess.run([sys.executable, "-m", "agent_sandbox.surfaces.cli", "sandbox", "exec",
                          sandbox_id, "echo", "back"], env=_env(data_dir), text=True,
                         capture_output=True, timeout=120, cwd="/")
    assert out.stdout.strip() == "back", out.stderr[-2000:]
    _wait("a supervisor again", lambda: supervisor.status(data_dir).pid > 0, 10)
    again = supervisor.status(data_dir)
    assert again.pid != running.pid
    _abx(data_dir, "sandbox", "kill", sandbox_id)
    _wait("the supervisor exits once nothing is left",
          lambda: not supervisor.status(data_dir).running, supervisor.LINGER + 15)
    _wait("its process ends", lambda: not _pid_alive(again.pid), 10)


@pytest.mark.integration
def test_an_engine_killed_mid_create_is_cleaned_up_without_anyone_calling(data_dir: Path
                                                                          ) -> None:
    keeper = _abx(data_dir, "sandbox", "create")["sandbox_id"]
    _wait("the supervisor starts", lambda: supervisor.status(data_dir).pid > 0, 10)
    runc = Runc(data_dir / "runc")
    store = Store(data_dir / "state.db")
    orphan = ""
    for _attempt in range(5):  # until the kill lands between container start and ready
        child = subprocess.Popen([sys.executable, CHILD, "create"], env=_env(data_dir),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline() == "go\n"
        deadline = time.monotonic() + 60
        while not (made := [c for c in runc.list_ids() if c != keeper]):
            assert child.poll() is None and time.monotonic() < deadline, child.stderr
            time.sleep(0.005)
        child.kill()
        child.communicate()
        row = store.get_sandbox(made[0])
        if row is not None and row.state == SandboxState.CREATING:
            orphan = made[0]
            break
        if row is not None:  # the create finished first: not an orphan, try again
            _abx(data_dir, "sandbox", "kill", made[0])
    assert orphan, "no attempt left a half-made sandbox"

    def cleaned() -> bool:
        return (store.get_sandbox(orphan) is None and orphan not in runc.list_ids()
                and not (data_dir / "sandboxes" / orphan).exists()
                and store.get_volume(f"vol-{orphan[4:]}") is None)

    _wait("the orphan cleaned by the supervisor alone", cleaned, 15)
    assert [r.id for r in store.list_sandboxes()] == [keeper]
    assert _states(data_dir) == {keeper: "running"}
    _abx(data_dir, "sandbox", "kill", keeper)
    _wait("the supervisor exits once nothing is left",
          lambda: not supervisor.status(data_dir).running, supervisor.LINGER + 15)


def test_status_reads_a_garbled_status_file_as_running_unknown(tmp_path: Path) -> None:
    lock = tmp_path / supervisor.LOCK_NAME
    assert supervisor.status(tmp_path) == supervisor.Status(False)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for garbage in (b"\xff" * 10000, b"[1, 2]", b'{"pid": "x", "since": []}', b""):
            os.ftruncate(fd, 0)
            os.pwrite(fd, garbage, 0)
            assert supervisor.status(tmp_path) == supervisor.Status(True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, b'{"pid": 4242, "since": 12.5}', 0)
        assert supervisor.status(tmp_path) == supervisor.Status(True, 4242, 12.5)
        # A pid that is not a supervisor is never signalled.
        assert not supervisor.stop(tmp_path, timeout=0.2)
    finally:
        os.close(fd)
    assert supervisor.stop(tmp_path, timeout=0.2)


_KILL_ALL = """
from agent_sandbox.providers.local import local_provider
e = local_provider()
for i in e.list():
    e.kill(i.sandbox_id, delete_volume=True)
"""


@pytest.mark.integration
def test_a_rootless_users_sandbox_is_paused_with_no_process_alive(local_users: Any) -> None:
    from agent_sandbox.backends.runc.host import subids

    subids.reserve()  # before useradd: the user's subuids must not be the root engine's
    user = local_users.create()
    if user.run(["unshare", "--user", "--map-root-user", "true"]).returncode != 0:
        pytest.skip("unprivileged user namespaces do not work here")
    env = user.env(PYTHONPATH=ROOT, ABX_ENGINE="rootless")
    data = user.home / ".local" / "share" / "agent-sandbox"  # XDG_DATA_HOME's default

    def abx(*args: str) -> Any:
        proc = user.run([user.python(), "-m", "agent_sandbox.surfaces.cli", *args, "--json"],
                        env=env)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr[-3000:])
        return json.loads(proc.stdout) if proc.stdout.strip() else None

    try:
        sandbox_id = abx("sandbox", "create", "--timeout", "3")["sandbox_id"]
        _wait("the supervisor starts", lambda: supervisor.status(data).pid > 0, 10)
        pid = supervisor.status(data).pid
        assert Path(f"/proc/{pid}").stat().st_uid == user.uid  # the user's own process
        _wait("auto-pause", lambda: [s["state"] for s in abx("sandbox", "list")] == ["paused"],
              10)
        abx("sandbox", "kill", sandbox_id)
        _wait("the supervisor exits", lambda: not supervisor.status(data).running,
              supervisor.LINGER + 15)
    finally:
        user.run([user.python(), "-c", _KILL_ALL], env=env, timeout=120)
        supervisor.stop(data)
