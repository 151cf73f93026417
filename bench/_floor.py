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
