"""The floor a cold create is compared with: a bare ``runc run`` of a no-op container
(busybox ``true`` in a minimal bundle, no user namespace, no guest), timed in the same
bench run as the engine so load on a shared host moves both alike."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import summary


def _bundle(where: Path) -> Path | None:
    busybox = shutil.which("busybox")
    if busybox is None:
        return None
    rootfs = where / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    for d in ("proc", "dev", "sys", "tmp"):
        (rootfs / d).mkdir()
    shutil.copy(busybox, rootfs / "bin" / "busybox")
    (rootfs / "bin" / "true").symlink_to("busybox")
    spec = subprocess.run(["runc", "spec", "--bundle", str(where)], capture_output=True)
    if spec.returncode != 0:
        return None
    config = json.loads((where / "config.json").read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/true"]
    (where / "config.json").write_text(json.dumps(config))
    return where


def bare_runc_run(runs: int, warmup: int = 3) -> dict[str, Any]:
    """p50/p95 of ``runc run`` (create, start, wait, delete) of busybox ``true``;
    ``{"skipped": reason}`` when runc or busybox is missing."""
    if shutil.which("runc") is None:
        return {"skipped": "runc not installed"}
    with tempfile.TemporaryDirectory(prefix="abx-floor-", dir="/var/tmp") as tmp:
        bundle = _bundle(Path(tmp))
        if bundle is None:
            return {"skipped": "busybox not installed (apt-get install busybox-static)"}
        root = Path(tmp) / "state"
        samples: list[float] = []
        for i in range(warmup + runs):
            start = time.perf_counter()
            proc = subprocess.run(["runc", "--root", str(root), "run", "--bundle", str(bundle),
                                   f"abx-floor-{i}"], stdin=subprocess.DEVNULL,
                                  capture_output=True)
            elapsed = (time.perf_counter() - start) * 1000
            if proc.returncode != 0:
                return {"skipped": f"runc run failed: {proc.stderr.decode()[-300:]}"}
            if i >= warmup:
                samples.append(elapsed)
        return summary(samples)


_HOLD = ("import time\nx=bytearray({mb}<<20)\nx[::4096]=b'\\1'*len(x[::4096])\n"
         "print(1,flush=True)\ntime.sleep(1e6)")


def bare_criu(criu: str, memory_mb: int, runs: int) -> dict[str, Any]:
    """The floor pause and resume are compared with: ``criu dump`` and ``criu restore`` of a
    bare host process holding ``memory_mb`` (no container, no namespaces, no runc), with
    the same CRIU, in the same bench run. ``{"dump": summary, "restore": summary}``."""
    dumps: list[float] = []
    restores: list[float] = []
    with tempfile.TemporaryDirectory(prefix="abx-floor-criu-", dir="/var/tmp") as tmp:
        proc = subprocess.Popen(["python3", "-c", _HOLD.format(mb=memory_mb)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        assert proc.stdout is not None
        proc.stdout.readline()  # its memory is touched
        proc.stdout.close()
        pid = proc.pid
        try:
            for i in range(runs):
                images = Path(tmp) / str(i)
                images.mkdir()
                start = time.perf_counter()
                dump = subprocess.run([criu, "dump", "-t", str(pid), "-D", str(images)],
                                      capture_output=True)
                dumps.append((time.perf_counter() - start) * 1000)
                proc.wait()  # dumped, and gone
                if dump.returncode != 0:
                    return {"skipped": f"criu dump failed: {dump.stderr.decode()[-300:]}"}
                start = time.perf_counter()
                back = subprocess.run([criu, "restore", "-d", "-D", str(images)],
                                      capture_output=True)
                restores.append((time.perf_counter() - start) * 1000)
                if back.returncode != 0:
                    return {"skipped": f"criu restore failed: {back.stderr.decode()[-300:]}"}
                proc = _Adopted(pid)
        finally:
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)
    return {"dump": summary(dumps), "restore": summary(restores)}


class _Adopted:
    """A restored process: not our child (criu restore -d detaches it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def wait(self) -> None:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{self.pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.002)
