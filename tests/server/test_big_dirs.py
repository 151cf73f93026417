"""A directory of 5,000 files, symlinks and a 200 MiB file, up and back down with
upload_dir/download_dir: byte-identical, with bounded memory in the client and the gateway.

Run twice: on the embedded engine (the client process is the engine) and through a
gateway. Both the client and the gateway are fresh processes, so their peak RSS (VmHWM,
reset before the transfer) is this transfer's alone. The client is this file, run as a
script: ``python test_big_dirs.py TREE local|URL TOKEN``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _peak_rss import reset_peak, status_kb

FILES = 5000
LINKS = 300
BIG = 200 << 20
MAX_GROWTH_MB = 200  # the tree is ~210 MiB: nothing holds it whole
pytestmark = pytest.mark.integration  # ~35 s for both, most of it making the tree


def make_tree(root: Path) -> None:
    """The same tree every time: small files of seeded random bytes in 350 directories,
    relative links between them, one absolute link, one empty directory, a 200 MiB file
    of real (not sparse) data."""
    rnd = random.Random(16)
    for i in range(FILES):
        folder = root / f"d{i % 50:02d}" / f"s{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:04d}.txt").write_bytes(rnd.randbytes(rnd.randrange(0, 4096)))
    (root / "links").mkdir()
    for i in range(LINKS):
        os.symlink(f"../d{i % 50:02d}/s{i % 7}/f{i:04d}.txt", root / "links" / f"l{i}")
    os.symlink("/etc/hostname", root / "abs-link")
    (root / "empty").mkdir()
    with (root / "big.bin").open("wb") as fh:
        for _ in range(BIG >> 20):
            fh.write(rnd.randbytes(1 << 20))


def manifest(root: Path) -> dict[str, str]:
    """Every entry: a file's sha256, a link's target, or "dir"."""
    out: dict[str, str] = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            else:
                digest = hashlib.sha256()
                with path.open("rb") as fh:
                    while chunk := fh.read(1 << 20):
                        digest.update(chunk)
                out[rel] = digest.hexdigest()
    return out


@pytest.fixture(scope="module")
def tree() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="abx-big-tree-")) / "tree"
    root.mkdir()
    make_tree(root)
    yield root
    import shutil

    shutil.rmtree(root.parent)


def _run_client(tree: Path, *target: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABX_SANDBOX_")}
    out = subprocess.run([sys.executable, __file__, str(tree), *target], capture_output=True,
                         text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _check(client: dict[str, object], label: str) -> None:
    print(f"\n{label}: up {client['up_s']:.1f} s, down {client['down_s']:.1f} s; client peak "
          f"RSS growth {client['growth_mb']:.0f} MiB")
    assert client["same"], client["diff"]
    assert client["up"]["files"] == FILES + 1 and client["up"]["symlinks"] == LINKS + 1
    assert client["down"]["files"] == FILES + 1 and client["down"]["skipped"] == []
    assert client["inside_sha"] == client["big_sha"]
    assert client["growth_mb"] < MAX_GROWTH_MB, client


def test_big_tree_on_the_embedded_engine(tree: Path) -> None:
    _check(_run_client(tree, "local"), "embedded engine")


def test_big_tree_through_the_gateway(tree: Path) -> None:
    from agent_sandbox.surfaces.gateway.process import GatewayProcess
    from agent_sandbox.surfaces.http.keys import KeyStore

    keys_file = Path(tempfile.mkdtemp(prefix="abx-bigdir-keys-")) / "keys.db"
    _, token = KeyStore(keys_file).create("bigdir", max_sandboxes=2)
    gateway = GatewayProcess(keys_file=str(keys_file)).start()
    assert gateway.proc is not None
    try:
        pid = gateway.proc.pid
        _warm(gateway.url, token)
        base_kb = reset_peak(pid)
        client = _run_client(tree, gateway.url, token)
        gateway_mb = (status_kb(pid, "VmHWM") - base_kb) / 1024
    finally:
        gateway.stop()
    _check(client, "gateway")
    print(f"gateway peak RSS growth {gateway_mb:.0f} MiB")
    assert gateway_mb < MAX_GROWTH_MB, gateway_mb


def _warm(url: str, token: str) -> None:
    """The gateway's routes, threads and engine loaded before its peak is reset."""
    from agent_sandbox.remote import RemoteProvider

    provider = RemoteProvider(url, token)
    sid = provider.create().sandbox_id
    try:
        provider.write_dir_archive(sid, "/workspace/warm", [bytes(1024)])
        b"".join(provider.read_dir_archive(sid, "/workspace/warm"))
    finally:
        provider.kill(sid, delete_volume=True)
        provider.close()


# The client side: uploads the tree, downloads it back, compares, reports.

def _client(tree: Path, where: str, token: str | None) -> dict[str, object]:
    from agent_sandbox import Sandbox

    if where == "local":
        provider = None
    else:
        from agent_sandbox.remote import RemoteProvider

        provider = RemoteProvider(where, token)
    sb = Sandbox.create(disk_mb=1024, provider=provider)
    try:
        sb.files.write("/workspace/warm", b"x")
        base_kb = reset_peak("self")
        t0 = time.monotonic()
        up = sb.files.upload_dir(tree, "/workspace/tree")
        t1 = time.monotonic()
        back = Path(tempfile.mkdtemp(prefix="abx-big-back-")) / "tree"
        down = sb.files.download_dir("/workspace/tree", back, outside_links=True)
        t2 = time.monotonic()
        growth = (status_kb("self", "VmHWM") - base_kb) / 1024
        inside = sb.commands.run("sha256sum /workspace/tree/big.bin", timeout=120)
    finally:
        sb.kill(delete_volume=True)
    want, got = manifest(tree), manifest(back)
    diff = sorted(set(want.items()) ^ set(got.items()))[:10]
    import shutil

    shutil.rmtree(back.parent)
    return {"up_s": t1 - t0, "down_s": t2 - t1, "growth_mb": growth, "same": want == got,
            "diff": diff, "up": up.model_dump(), "down": down.model_dump(),
            "big_sha": want["big.bin"], "inside_sha": inside.stdout.split()[0]}


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(_client(Path(args[0]), args[1], args[2] if len(args) > 2 else None)))
