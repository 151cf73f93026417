"""A full host disk: every write a sandbox saw succeed is there, the rest fail with ENOSPC.

The engine's data dir lives on a small loop-mounted filesystem. The engine admits only
the sandboxes whose disks it can give real blocks to while keeping its reserve; then
another host process takes nearly all the space left, and every sandbox writes until its
disk is full, all at once. Each write confirmed by fsync must read back byte for byte,
every image must pass e2fsck, and the engine must still pause, resume and kill.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox.backends.runc import supervisor
from agent_sandbox.backends.runc.host import syscalls
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.core.errors import ResourceExhaustedError
from agent_sandbox.providers.local import embedded_service
from agent_sandbox.service.service import SandboxService

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MB = 1 << 20
HOST_MB = 640
RESERVE_MB = 64
DISK_MB = 96

# Writes 1 MiB blocks (a different pattern each) until the disk refuses; a block counts
# only once fsync confirmed it. Prints what was confirmed and how the writing ended.
WRITER = r"""
import errno, hashlib, json, os
path = "/workspace/fill.bin"
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
digest, confirmed, pending, error, i = hashlib.sha256(), 0, b"", None, 0
while error is None:
    block = hashlib.sha256(str(i).encode()).digest() * 32768
    i += 1
    try:
        done = os.write(fd, block)
        pending += block[:done]
        if done < len(block):
            os.write(fd, block[done:])  # a short write: the next one says why
        os.fsync(fd)
    except OSError as exc:
        error = exc.errno
        break
    digest.update(pending)
    confirmed += len(pending)
    pending = b""
print(json.dumps({"confirmed": confirmed, "sha256": digest.hexdigest(), "errno": error}))
"""

CHECK = r"""
import hashlib, json, os, sys
n = int(sys.argv[1])
with open("/workspace/fill.bin", "rb") as fh:
    data = fh.read(n)
print(json.dumps({"size": os.path.getsize("/workspace/fill.bin"),
                  "sha256": hashlib.sha256(data).hexdigest(), "read": len(data)}))
"""


@pytest.fixture
def small_host() -> Iterator[Path]:
    """A HOST_MB ext4 filesystem, loop-mounted: the host disk that fills up."""
    # Not under pytest's 0700 tmp dir: sandboxes' root must traverse to their rootfs.
    top = Path(tempfile.mkdtemp(prefix="abx-host-", dir="/var/tmp"))
    top.chmod(0o711)
    image, mnt = top / "host.img", top / "host"
    with open(image, "wb") as fh:
        fh.truncate(HOST_MB * MB)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
        image.unlink()
        mnt.rmdir()
        top.rmdir()


def _json(engine: SandboxService, sandbox_id: str, script: str, *args: str) -> dict[str, object]:
    res = engine.run(sandbox_id, "python3 - " + " ".join(args), stdin=script, timeout=120)
    assert res.exit_code == 0, res
    return json.loads(res.stdout)


def _admit_until_refused(engine: SandboxService) -> list[str]:
    ids: list[str] = []
    for _ in range(2 * HOST_MB // DISK_MB):  # twice what the host holds, if all were admitted
        try:
            ids.append(engine.create(disk_mb=DISK_MB).sandbox_id)
        except ResourceExhaustedError as exc:
            assert "host disk too full" in str(exc) and "disk_mb" in str(exc), exc
            return ids
    pytest.fail(f"{len(ids)} disks of {DISK_MB} MB admitted on a {HOST_MB} MB host disk")


def _take_the_rest(host: Path, leave_mb: int) -> None:
    """Another host process takes all but ``leave_mb`` of the free space."""
    take = shutil.disk_usage(host).free - leave_mb * MB
    fd = os.open(host / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        syscalls.fallocate(fd, take)
    finally:
        os.close(fd)


def _fill_all(engine: SandboxService, ids: list[str]) -> dict[str, dict[str, object]]:
    results: dict[str, dict[str, object]] = {}

    def fill(sandbox_id: str) -> None:
        results[sandbox_id] = _json(engine, sandbox_id, WRITER)

    threads = [threading.Thread(target=fill, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _fsck(image: Path) -> None:
    check = subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_full_host_disk_loses_no_write(small_host: Path) -> None:
    data = small_host / "data"
    engine = embedded_service(EngineConfig(data_dir=data, host_reserve_mb=RESERVE_MB), reaper=False)
    try:
        ids = _admit_until_refused(engine)
        assert len(ids) >= 3, f"only {len(ids)} sandboxes admitted"
        _take_the_rest(small_host, leave_mb=16)

        results = _fill_all(engine, ids)
        for sandbox_id, res in results.items():
            assert res["errno"] == 28, res  # ENOSPC, inside the sandbox
            assert int(res["confirmed"]) > DISK_MB * MB // 2, res  # its disk, really given
            back = _json(engine, sandbox_id, CHECK, str(res["confirmed"]))
            assert back["read"] == res["confirmed"] and back["sha256"] == res["sha256"], \
                (sandbox_id, res, back)

        # The engine keeps its own state writable: pause, resume, kill keeping a volume.
        first = ids[0]
        engine.pause(first)
        engine.resume(first)
        again = _json(engine, first, CHECK, str(results[first]["confirmed"]))
        assert again["sha256"] == results[first]["sha256"]
        volumes = [engine.info(i).volume_id for i in ids]
        for sandbox_id in ids:
            engine.kill(sandbox_id)
        for volume_id in volumes:
            image = data / "volumes" / f"{volume_id}.img"
            _fsck(image)
            kept = image.stat().st_blocks * 512
            assert kept < image.stat().st_size, "a kept volume still holds its unused blocks"
        # Kept volumes gave their unused blocks back (the data stays): room to create again.
        (small_host / "filler").unlink()
        fresh = engine.create(disk_mb=DISK_MB, volume=volumes[0])
        back = _json(engine, fresh.sandbox_id, CHECK, str(results[first]["confirmed"]))
        assert back["sha256"] == results[first]["sha256"]
    finally:
        for info in engine.list():
            engine.kill(info.sandbox_id, delete_volume=True)
        for volume in engine.list_volumes():
            engine.delete_volume(volume.volume_id)
        engine.close()
        engine.backend.release_host_mounts()
        supervisor.stop(data)
