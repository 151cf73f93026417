"""Durability: sandboxes outlive the engine process, however it ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from agent_sandbox import Sandbox
from agent_sandbox.providers.local import local_provider

pytestmark = pytest.mark.integration

_CREATE_AND_DIE = textwrap.dedent("""
    import json, os, sys, time
    from agent_sandbox import Sandbox
    sb = Sandbox.create(persistent=True)
    sb.files.write("/workspace/keep.txt", "survives")
    h = sb.commands.run("while :; do echo beat >> /workspace/beats; sleep 0.1; done",
                        background=True)
    paused = Sandbox.create()
    paused.files.write("/workspace/p.txt", "paused one")
    paused.pause()
    print(json.dumps({"id": sb.sandbox_id, "pid": h.pid, "paused": paused.sandbox_id}),
          flush=True)
    if sys.argv[1] == "kill9":
        os.kill(os.getpid(), 9)
""")


def _run_engine_process(how: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CREATE_AND_DIE, how], capture_output=True,
                          text=True, timeout=120, env=os.environ.copy())
    if how == "kill9":
        assert proc.returncode == -9, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("how", ["clean", "kill9"])
def test_sandboxes_survive_engine_exit(how: str) -> None:
    made = _run_engine_process(how)
    local_provider().backend.recover()  # what a fresh engine process does first
    sb = Sandbox.connect(made["id"])
    paused = Sandbox.connect(made["paused"])
    try:
        assert sb.state == "running"
        assert sb.files.read("/workspace/keep.txt") == "survives"
        procs = {p.pid: p for p in sb.commands.list()}
        assert procs[made["pid"]].running
        beats = sb.files.read("/workspace/beats").count("beat")
        time.sleep(0.4)
        assert sb.files.read("/workspace/beats").count("beat") > beats
        assert paused.info().state == "paused"
        assert paused.files.read("/workspace/p.txt") == "paused one"
        assert paused.info().state == "running"
    finally:
        sb.kill(delete_volume=True)
        paused.kill(delete_volume=True)


_CRASH_MID_CREATE = textwrap.dedent("""
    import os
    from agent_sandbox.backends.runc import boot
    def crash(self, sandbox_id, output):
        print(sandbox_id, flush=True)
        os.kill(os.getpid(), 9)
    boot.Booter.wait_ready = crash  # die once the container is up, before ready
    from agent_sandbox import Sandbox
    Sandbox.create()
""")


def test_crash_mid_create_leaves_nothing_behind() -> None:
    engine = local_provider()  # open now: opening recovers, and must not before the look
    proc = subprocess.run([sys.executable, "-c", _CRASH_MID_CREATE], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    sandbox_id = proc.stdout.strip()
    assert engine.backend.store.get_sandbox(sandbox_id) is not None  # the half-made row exists
    engine.backend.recover()
    assert engine.backend.store.get_sandbox(sandbox_id) is None
    assert sandbox_id not in engine.backend.runc.list_ids()
    sbdir = str(engine.config.sandboxes_dir / sandbox_id)
    with open("/proc/self/mountinfo") as fh:
        assert not [line for line in fh if sbdir in line]
    assert not os.path.exists(sbdir)
    assert f"vol-{sandbox_id[4:]}" not in {v.volume_id for v in engine.list_volumes()}
