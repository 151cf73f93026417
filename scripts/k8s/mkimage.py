#!/usr/bin/env python3
"""Write a docker-archive image tar (as `docker save` writes, `ctr images import` reads).

Usage: mkimage.py ROOTFS_DIR REPO:TAG OUT.tar [--cmd '["/pause"]'] [--env K=V ...]
One layer, every mtime 0: the same rootfs gives the same image id. The archive is written by
agent_sandbox/backends/kubernetes/image_archive.py (what `abx template push` uses), loaded by
path: this runs with the system python3, agent-sandbox need not be installed.
"""

import argparse
import importlib.util
import json
import os
import sys
import tarfile
from pathlib import Path

_ARCHIVE = (Path(__file__).resolve().parents[2]
            / "agent_sandbox" / "backends" / "kubernetes" / "image_archive.py")


def _archive_module():
    spec = importlib.util.spec_from_file_location("abx_image_archive", _ARCHIVE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _zero_mtime(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = 0
    return info


def main() -> None:
    archive = _archive_module()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rootfs")
    ap.add_argument("ref")
    ap.add_argument("out")
    ap.add_argument("--cmd", default='["/bin/sh"]')
    ap.add_argument("--env", action="append", default=[archive.DEFAULT_PATH])
    a = ap.parse_args()

    def fill(tar: tarfile.TarFile) -> None:
        for name in sorted(os.listdir(a.rootfs)):
            tar.add(os.path.join(a.rootfs, name), arcname=name, filter=_zero_mtime)

    info = archive.write_archive(a.out, fill, a.ref, {"Cmd": json.loads(a.cmd), "Env": a.env,
                                                      "WorkingDir": "/"})
    print(info.path, info.size, "bytes", info.ref)


if __name__ == "__main__":
    main()
