#!/usr/bin/env python3
"""Write a docker-archive image tar (as `docker save` writes, `ctr images import` reads).

Usage: mkimage.py ROOTFS_DIR REPO:TAG OUT.tar [--cmd '["/pause"]'] [--env K=V ...]
One layer, every mtime 0: the same rootfs gives the same image id.
"""

import argparse
import hashlib
import io
import json
import os
import tarfile

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _zero_mtime(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = 0
    return info


def layer_tar(rootfs: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(rootfs)):
            tar.add(os.path.join(rootfs, name), arcname=name, filter=_zero_mtime)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rootfs")
    ap.add_argument("ref")
    ap.add_argument("out")
    ap.add_argument("--cmd", default='["/bin/sh"]')
    ap.add_argument("--env", action="append", default=[DEFAULT_PATH])
    a = ap.parse_args()
    layer = layer_tar(a.rootfs)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Cmd": json.loads(a.cmd), "Env": a.env, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "scripts/k8s/mkimage.py"}],
    }
    cfg = json.dumps(config).encode()
    cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [a.ref], "Layers": ["layer.tar"]}])
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w") as tar:
        members = (("layer.tar", layer), (cfg_name, cfg), ("manifest.json", manifest.encode()))
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, a.out)
    print(a.out, os.path.getsize(a.out), "bytes", a.ref)


if __name__ == "__main__":
    main()
