"""A separate engine process for test_durability.py: one lifecycle step (to be SIGKILLed
part way), or a fresh process's recovery and a survey of what it left.

    python _durability_child.py OP [SANDBOX_ID]   # prints "go" once its engine is up
    python _durability_child.py survey             # recovery, then one JSON line
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import struct
import sys
from pathlib import Path

from agent_sandbox.core.errors import SandboxError
from agent_sandbox.providers.local import local_provider

BIG = "/workspace/big.bin"
_LOOP_GET_STATUS64 = 0x4C05
_LOOP_INFO64 = 232  # struct loop_info64; its lo_file_name[64] is at offset 56


def _loop_names() -> list[str]:
    """What each bound loop device was told its backing file is (the engine gives the
    full path there; sysfs shows only /<image name>, opened through a detached mount)."""
    names = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):  # freed meanwhile
            fd = os.open(f"/dev/{backing.parent.parent.name}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                info = fcntl.ioctl(fd, _LOOP_GET_STATUS64, bytes(_LOOP_INFO64))
            finally:
                os.close(fd)
            names.append(struct.unpack_from("64s", info, 56)[0].split(b"\0")[0].decode())
    return names


def step(op: str, sandbox_id: str) -> None:
    engine = local_provider()
    print("go", flush=True)
    if op == "create":
        print(engine.create().sandbox_id, flush=True)
    elif op == "pause":
        engine.pause(sandbox_id)
    elif op == "resume":
        engine.resume(sandbox_id)
    elif op == "reset":
        engine.reset_rootfs(sandbox_id)
    elif op == "kill-keep":
        engine.kill(sandbox_id, delete_volume=False)
    elif op == "kill-delete":
        engine.kill(sandbox_id, delete_volume=True)
    elif op == "write":
        engine.write_file(sandbox_id, BIG, os.urandom(8 << 20))
    elif op == "snapshot":
        print(engine.snapshot(sandbox_id).snapshot_id, flush=True)
    elif op == "fork":  # sandbox_id is a snapshot's id here
        print(engine.create(snapshot=sandbox_id).sandbox_id, flush=True)
    elif op == "race":  # pause/resume/kill from two processes at once; errors reported
        errors = []
        for i in range(20):
            try:
                (engine.pause if i % 2 else engine.resume)(sandbox_id)
            except SandboxError as exc:
                errors.append(f"{exc.code}: {exc}")
        print(json.dumps(errors), flush=True)
    else:
        raise SystemExit(f"unknown op {op}")
    print("done", flush=True)


def survey() -> None:
    engine = local_provider()  # its start is the recovery under test
    data = engine.config.data_dir
    live = {s.sandbox_id: s for s in engine.list()}
    rows = {r.id: r.state for r in engine.backend.store.list_sandboxes()}
    usable = {}
    for sandbox_id in live:
        try:
            usable[sandbox_id] = engine.run(sandbox_id, "echo ok", timeout=30).stdout
        except SandboxError as exc:
            usable[sandbox_id] = f"{exc.code}: {exc}"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if line.split()[4].startswith(str(data / "sandboxes") + "/")]
    loops = [name for name in _loop_names() if name.startswith(str(data))]
    trash = [str(p) for p in (data / "sandboxes").glob("*/disk/.trash-*")]
    volumes = {}
    for vol in engine.list_volumes():
        volumes[vol.volume_id] = vol.attached_to
    snapshots = {s.snapshot_id: s.sandbox_id for s in engine.list_snapshots()}
    print(json.dumps({
        "rows": rows, "usable": usable, "volumes": volumes, "snapshots": snapshots,
        "snapshot_temps": sorted(p.name for p in (data / "snapshots").glob(".new-*")),
        "containers": engine.backend.runc.list_ids(),
        "dirs": sorted(p.name for p in (data / "sandboxes").iterdir()),
        "mounts": mounts, "loops": loops, "trash": trash,
    }), flush=True)


def workspace_hash(sandbox_id: str) -> str:
    engine = local_provider()
    return hashlib.sha256(b"".join(engine.read_file(sandbox_id, BIG))).hexdigest()


if __name__ == "__main__":
    if sys.argv[1] == "survey":
        survey()
    elif sys.argv[1] == "hash":
        print(workspace_hash(sys.argv[2]), flush=True)
    else:
        step(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
