"""Nothing lost, nothing stuck: the engine SIGKILLed part way through each lifecycle step.

For each step (create, pause, resume, reset_rootfs, kill keeping / deleting the volume,
a file write) a separate engine process is killed at several moments into it; then a
fresh process starts (its start is the recovery) and surveys the data dir: every sandbox
is usable or cleanly gone, nothing is half made or half killed, a kept volume's bytes are
identical, and no container, mount, loop device, sandbox dir or trash is left behind.
Then two processes race pause/resume on one sandbox, and two kill it at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.errors import NotFoundError, WrongStateError
from agent_sandbox.providers.local import local_provider
from agent_sandbox.runtime.engine import Engine

pytestmark = pytest.mark.integration

CHILD = str(Path(__file__).with_name("_durability_child.py"))
BIG = "/workspace/big.bin"
# Seconds into the step: from before it starts to after most of it is done.
DELAYS = (0.0, 0.015, 0.05, 0.12)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return local_provider()


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, CHILD, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    assert ready and proc.stdout.readline() == "go\n", proc.stderr.read() if proc.stderr else ""


def _crash(op: str, sandbox_id: str, delay: float) -> None:
    proc = _child(op, sandbox_id)
    _wait_go(proc)
    time.sleep(delay)
    proc.kill()
    proc.communicate()


def _survey() -> dict[str, Any]:
    proc = subprocess.run([sys.executable, CHILD, "survey"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_clean(engine: Engine, seen: dict[str, Any]) -> None:
    rows = seen["rows"]
    assert set(rows.values()) <= {"running", "paused"}, f"left half done: {rows}"
    assert all(out == "ok\n" for out in seen["usable"].values()), seen["usable"]
    assert set(seen["containers"]) <= set(rows), "orphan container"
    assert set(seen["dirs"]) <= set(rows), "orphan sandbox dir"
    for mount in seen["mounts"]:
        assert mount.split("/sandboxes/")[1].split("/")[0] in rows, f"orphan mount {mount}"
    attached = {f"{engine.mode.layout.volume(vol)}" for vol, owner in seen["volumes"].items()
                if owner in rows}
    assert set(seen["loops"]) <= attached, "orphan loop device"
    assert seen["trash"] == [], "trash left behind"


def _sandbox_with_data(engine: Engine) -> tuple[str, str]:
    sandbox_id = engine.create().sandbox_id
    data = os.urandom(4 << 20)
    engine.write_file(sandbox_id, BIG, data)
    return sandbox_id, hashlib.sha256(data).hexdigest()


def _hash(engine: Engine, sandbox_id: str) -> str:
    return hashlib.sha256(b"".join(engine.read_file(sandbox_id, BIG))).hexdigest()


def _volume_hash(engine: Engine, volume_id: str) -> str:
    sandbox_id = engine.create(volume=volume_id).sandbox_id
    try:
        return _hash(engine, sandbox_id)
    finally:
        engine.kill(sandbox_id)  # the volume stays: the caller deletes it


@pytest.mark.parametrize("op", ["create", "pause", "resume", "reset", "kill-keep",
                                "kill-delete", "write"])
def test_sigkill_at_each_step(engine: Engine, op: str) -> None:
    for delay in DELAYS:
        sandbox_id, digest = _sandbox_with_data(engine)
        volume_id = engine.info(sandbox_id).volume_id
        if op == "resume":
            engine.pause(sandbox_id)
        _crash(op, sandbox_id, delay)
        seen = _survey()
        alive = sandbox_id in seen["rows"]
        try:
            # Inside: a sandbox left unusable is killed too (it failed every later test).
            _assert_clean(engine, seen)
            if op == "kill-keep" and not alive:
                assert seen["volumes"].get(volume_id) == "", f"kept volume lost ({delay})"
                assert _volume_hash(engine, volume_id) == digest, f"kept volume changed ({delay})"
            elif op == "kill-delete" and not alive:
                assert volume_id not in seen["volumes"]
                assert not engine.mode.layout.volume(volume_id).exists()
            elif op == "write":
                assert alive
                size = engine.run(sandbox_id, f"stat -c %s {BIG}; ls -a /workspace").stdout
                # All of the old file or all of the new one; no temporary file left over.
                assert _hash(engine, sandbox_id) == digest or size.startswith(f"{8 << 20}\n")
                assert ".abx-" not in size, size
            elif op != "create":
                assert alive, f"{op} crashed at {delay}s lost the sandbox"
                assert _hash(engine, sandbox_id) == digest
        finally:
            for leftover in (sandbox_id, *[s for s in seen["rows"] if s != sandbox_id]):
                try:
                    engine.kill(leftover, delete_volume=True)
                except NotFoundError:
                    pass
            if volume_id in {v.volume_id for v in engine.list_volumes()}:
                engine.delete_volume(volume_id)


def test_two_processes_race_pause_resume_and_kill(engine: Engine) -> None:
    sandbox_id, digest = _sandbox_with_data(engine)
    racers = [_child("race", sandbox_id) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in racers]
    for proc, (out, err) in zip(racers, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
        errors = json.loads(out.splitlines()[1])
        assert all("busy" in e for e in errors), errors
    _assert_clean(engine, _survey())
    assert _hash(engine, sandbox_id) == digest

    killers = [_child("kill-delete", sandbox_id) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in killers]
    done = [out.endswith("done\n") for out, _ in results]
    assert any(done), results
    for (_out, err), ok in zip(results, done, strict=True):
        assert ok or "NotFoundError" in err, err[-3000:]
    seen = _survey()
    _assert_clean(engine, seen)
    assert sandbox_id not in seen["rows"]


def test_a_second_engine_starting_during_a_kill_keeps_the_volume(engine: Engine) -> None:
    sandbox_id, digest = _sandbox_with_data(engine)
    volume_id = engine.info(sandbox_id).volume_id
    killer = threading.Thread(target=engine.kill, args=(sandbox_id,))
    killer.start()
    seen = _survey()  # a fresh process's recovery, while (or just after) the kill runs
    killer.join()
    try:
        _assert_clean(engine, _survey())
        assert _volume_hash(engine, volume_id) == digest
    finally:
        engine.delete_volume(volume_id)
    assert seen["rows"].get(sandbox_id) in (None, "running", "killing")


def test_a_volume_claimed_by_a_sandbox_that_never_existed_is_released(engine: Engine) -> None:
    # Older engines claimed a kept volume before inserting the new sandbox's row; a crash
    # in between left the volume attached to nobody: neither attachable nor deletable.
    sandbox_id, digest = _sandbox_with_data(engine)
    volume_id = engine.info(sandbox_id).volume_id
    engine.kill(sandbox_id)
    assert engine.store.claim_volume(volume_id, "sbx-neverexist0") is not None
    engine.recover()
    again = engine.create(volume=volume_id)
    try:
        assert _hash(engine, again.sandbox_id) == digest
    finally:
        engine.kill(again.sandbox_id, delete_volume=True)


def test_attaching_a_volume_in_use_leaves_it_with_its_sandbox(engine: Engine) -> None:
    sandbox_id, _ = _sandbox_with_data(engine)
    volume_id = engine.info(sandbox_id).volume_id
    try:
        with pytest.raises(WrongStateError, match="attached"):
            engine.create(volume=volume_id)
        assert {v.volume_id: v.attached_to for v in engine.list_volumes()}[volume_id] \
            == sandbox_id
        assert not [i for i in engine.list() if i.volume_id == volume_id
                    and i.sandbox_id != sandbox_id]
    finally:
        engine.kill(sandbox_id, delete_volume=True)
