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
from snapshotting import memory_snapshots_missing

from agent_sandbox.core.errors import NotFoundError, WrongStateError
from agent_sandbox.providers.local import local_provider
from agent_sandbox.service.service import SandboxService

pytestmark = pytest.mark.integration

CHILD = str(Path(__file__).with_name("_durability_child.py"))
BIG = "/workspace/big.bin"
# Seconds into the step: from before it starts to after most of it is done.
DELAYS = (0.0, 0.015, 0.05, 0.12)


@pytest.fixture(scope="module")
def engine() -> SandboxService:
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


def _assert_clean(engine: SandboxService, seen: dict[str, Any]) -> None:
    rows = seen["rows"]
    assert set(rows.values()) <= {"running", "paused"}, f"left half done: {rows}"
    assert all(out == "ok\n" for out in seen["usable"].values()), seen["usable"]
    assert set(seen["containers"]) <= set(rows), "orphan container"
    assert set(seen["dirs"]) <= set(rows), "orphan sandbox dir"
    for mount in seen["mounts"]:
        assert mount.split("/sandboxes/")[1].split("/")[0] in rows, f"orphan mount {mount}"
    layout = engine.backend.mode.layout
    attached = {f"{layout.volume(vol)}" for vol, owner in seen["volumes"].items()
                if owner in rows}
    assert set(seen["loops"]) <= attached, "orphan loop device"
    assert seen["trash"] == [], "trash left behind"


def _sandbox_with_data(engine: SandboxService) -> tuple[str, str]:
    sandbox_id = engine.create().sandbox_id
    data = os.urandom(4 << 20)
    engine.write_file(sandbox_id, BIG, data)
    return sandbox_id, hashlib.sha256(data).hexdigest()


def _hash(engine: SandboxService, sandbox_id: str) -> str:
    return hashlib.sha256(b"".join(engine.read_file(sandbox_id, BIG))).hexdigest()


def _volume_hash(engine: SandboxService, volume_id: str) -> str:
    sandbox_id = engine.create(volume=volume_id).sandbox_id
    try:
        return _hash(engine, sandbox_id)
    finally:
        engine.kill(sandbox_id)  # the volume stays: the caller deletes it


@pytest.mark.parametrize("op", ["create", "pause", "resume", "reset", "kill-keep",
                                "kill-delete", "write"])
def test_sigkill_at_each_step(engine: SandboxService, op: str) -> None:
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
                assert not engine.backend.mode.layout.volume(volume_id).exists()
            elif op == "write":
                assert alive
                size = engine.run(sandbox_id, f"stat -c %s {BIG}; ls -a /workspace").stdout
                # All of the old file or all of the new one; no temporary file left over.
                assert _hash(engine, sandbox_id) == digest or size.startswith(f"{8 << 20}\n")
                assert ".abx-" not in size and ".abx_" not in size, size  # replacing or new
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


# A checkpoint (CRIU) takes a few tenths of a second: killed before, in, and after it.
CHECKPOINT_DELAYS = (0.05, 0.3)


@pytest.mark.parametrize("op", ["snapshot", "fork"])
def test_sigkill_at_each_step_of_snapshots(engine: SandboxService, op: str) -> None:
    if (why := memory_snapshots_missing(engine)) is not None:
        pytest.skip(why)
    sandbox_id, digest = _sandbox_with_data(engine)
    snap = engine.snapshot(sandbox_id).snapshot_id if op == "fork" else ""
    try:
        for delay in CHECKPOINT_DELAYS:
            before = {r.id for r in engine.backend.store.list_sandboxes()}
            # The worker's data dir may hold snapshots of earlier tests: only new ones count.
            snaps_before = {s.snapshot_id for s in engine.list_snapshots()} - {snap}
            _crash(op, snap or sandbox_id, delay)
            seen = _survey()
            _assert_clean(engine, seen)
            assert seen["snapshot_temps"] == [], "a half-taken snapshot was left"
            assert sandbox_id in seen["rows"], f"{op} crashed at {delay}s lost the sandbox"
            assert _hash(engine, sandbox_id) == digest
            for snapshot_id, parent in seen["snapshots"].items():
                if snapshot_id in snaps_before:
                    continue
                assert parent == sandbox_id
                if op == "snapshot" and snapshot_id != snap:
                    engine.delete_snapshot(snapshot_id)  # a whole one (taken before the kill)
            for new in set(seen["rows"]) - before:  # a fork that started: a whole copy
                assert _hash(engine, new) == digest
                engine.kill(new, delete_volume=True)
    finally:
        engine.kill(sandbox_id, delete_volume=True)
        if snap:
            engine.delete_snapshot(snap)


def test_two_processes_race_pause_resume_and_kill(engine: SandboxService) -> None:
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


def test_a_second_engine_starting_during_a_kill_keeps_the_volume(engine: SandboxService) -> None:
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


def test_a_volume_claimed_by_a_sandbox_that_never_existed_is_released(
        engine: SandboxService) -> None:
    # Older engines claimed a kept volume before inserting the new sandbox's row; a crash
    # in between left the volume attached to nobody: neither attachable nor deletable.
    sandbox_id, digest = _sandbox_with_data(engine)
    volume_id = engine.info(sandbox_id).volume_id
    engine.kill(sandbox_id)
    assert engine.backend.store.claim_volume(volume_id, "sbx-neverexist0") is not None
    engine.backend.recover()
    again = engine.create(volume=volume_id)
    try:
        assert _hash(engine, again.sandbox_id) == digest
    finally:
        engine.kill(again.sandbox_id, delete_volume=True)


def test_attaching_a_volume_in_use_leaves_it_with_its_sandbox(engine: SandboxService) -> None:
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


def test_a_volume_held_by_a_kill_that_failed_midway_can_be_deleted(
        engine: SandboxService, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kill is hidden from list() from its first step: a failure after it (here the
    # host refusing the volume's removal once) must not leave the volume undeletable.
    sandbox_id = engine.create().sandbox_id
    volume_id = engine.info(sandbox_id).volume_id
    parts = engine.backend.parts
    remove = parts.mode.remove_volume

    def refuse_once(volume: str) -> None:
        monkeypatch.setattr(parts.mode, "remove_volume", remove)
        raise OSError("host refused")

    monkeypatch.setattr(parts.mode, "remove_volume", refuse_once)
    with pytest.raises(OSError):
        engine.kill(sandbox_id, delete_volume=True)
    assert sandbox_id not in {i.sandbox_id for i in engine.list()}
    engine.delete_volume(volume_id)
    assert volume_id not in {v.volume_id for v in engine.list_volumes()}
    assert engine.backend.store.get_sandbox(sandbox_id) is None


def test_a_volume_claimed_by_a_vanished_sandbox_can_be_deleted(
        engine: SandboxService) -> None:
    sandbox_id = engine.create().sandbox_id
    volume_id = engine.info(sandbox_id).volume_id
    engine.kill(sandbox_id)
    assert engine.backend.store.claim_volume(volume_id, "sbx-neverexist1") is not None
    engine.delete_volume(volume_id)  # no recover() in between
    assert volume_id not in {v.volume_id for v in engine.list_volumes()}


def test_warm_pooled_sandboxes_volumes_are_nobodys_to_list(engine: SandboxService) -> None:
    parts = engine.backend.parts
    row = engine.backend.store.get_sandbox(engine.create().sandbox_id)
    assert row is not None
    engine.backend.store.update_sandbox(row.id, state="pooled")  # as the warm pool holds it
    try:
        assert row.volume_id not in {v.volume_id for v in engine.list_volumes()}
    finally:
        parts.destroy(row, delete_volume=True)
