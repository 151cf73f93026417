"""Memory snapshots on real runc with CRIU: pause keeps processes and memory on disk and
frees them, resume restores them; a snapshot starts any number of copies at once; a
refused restore keeps the sandbox paused with its image; a sandbox that tries to break
its own checkpoint hurts nobody else. Skipped, with the reason, without a working CRIU."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from snapshotting import memory_snapshots_missing

from agent_sandbox.config.engine import HOST_ID_BASE
from agent_sandbox.core.errors import NotFoundError, RuntimeUnavailableError, SandboxError
from agent_sandbox.providers.local import local_provider
from agent_sandbox.service.service import SandboxService

pytestmark = pytest.mark.integration

# A counter that proves a process ran on from where it was (its value only grows, its pid
# stays), and a loopback server.
COUNTER = ("nohup python3 -c 'import time\nn=0\nwhile 1:\n n+=1\n"
           " open(\"/tmp/n.tmp\",\"w\").write(str(n))\n __import__(\"os\").replace("
           "\"/tmp/n.tmp\",\"/tmp/n\")\n time.sleep(0.05)' >/dev/null 2>&1 & echo $!")
SERVER = "cd /tmp && nohup python3 -m http.server 8000 >/dev/null 2>&1 &"
GET = ("python3 -c \"import urllib.request as u;"
       "print(u.urlopen('http://127.0.0.1:8000/',timeout=5).status)\"")


@pytest.fixture(scope="module")
def engine() -> SandboxService:
    service = local_provider()
    if (why := memory_snapshots_missing(service)) is not None:
        pytest.skip(why)
    return service


@pytest.fixture(scope="module")
def busy(engine: SandboxService) -> tuple[str, int]:
    """One sandbox with a counter, a loopback server and a /workspace file (shared)."""
    sandbox_id = engine.create(timeout=600).sandbox_id
    pid = int(engine.run(sandbox_id, COUNTER).stdout.strip())
    engine.run(sandbox_id, SERVER)
    engine.write_file(sandbox_id, "/workspace/note.txt", b"from the parent")
    _until(lambda: engine.run(sandbox_id, GET).stdout == "200\n")
    yield sandbox_id, pid
    engine.kill(sandbox_id, delete_volume=True)


def _until(ok: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not ok():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within time"
        time.sleep(0.05)


def _count(engine: SandboxService, sandbox_id: str) -> int:
    return int(engine.run(sandbox_id, "cat /tmp/n").stdout)


def _alive(engine: SandboxService, sandbox_id: str, pid: int) -> bool:
    return engine.run(sandbox_id, f"kill -0 {pid} && echo yes").stdout == "yes\n"


def test_pause_checkpoints_to_disk_and_resume_carries_on(engine: SandboxService,
                                                         busy: tuple[str, int]) -> None:
    sandbox_id, pid = busy
    runc = engine.backend.runc
    for _ in range(2):  # a restored sandbox checkpoints again
        before = _count(engine, sandbox_id)
        assert engine.pause(sandbox_id).state == "paused"
        # No container holds its memory: it is an image on disk, host-only.
        assert runc.state(sandbox_id) is None
        image = engine.backend.parts.image_dir(sandbox_id)
        assert image.is_dir()
        assert engine.resume(sandbox_id).state == "running"
        assert _alive(engine, sandbox_id, pid), "the counter's process was not restored"
        assert _count(engine, sandbox_id) >= before, "the counter started over"
        assert engine.run(sandbox_id, GET).stdout == "200\n", "the server does not answer"
        assert not image.exists(), "a restored image was kept"


# Tries to open (or list) every path as one host user, no other groups; prints those it could.
_READS = ("import json,os,sys\nout=[]\nfor p in json.load(sys.stdin):\n try:\n"
          "  os.listdir(p) if os.path.isdir(p) else os.close(os.open(p,os.O_RDONLY))\n"
          "  out.append(p)\n except OSError: pass\nprint(json.dumps(out))")


def _readable_as(uid: int, paths: list[str]) -> list[str]:
    done = subprocess.run(["/usr/bin/python3", "-I", "-c", _READS], input=json.dumps(paths),
                          capture_output=True, text=True, user=uid, group=uid,
                          extra_groups=[], timeout=30, check=True)
    return json.loads(done.stdout)


def test_images_and_snapshots_are_host_only(engine: SandboxService,
                                            busy: tuple[str, int]) -> None:
    """Nothing of a snapshot or a paused sandbox's image is readable by another host
    user; the sandboxes' root (CRIU restores as it, in the sandbox's user namespace)
    reads the memory images alone: not the host's records, not the copied files."""
    snap = engine.snapshot(busy[0], "private").snapshot_id
    paused = engine.create().sandbox_id
    try:
        engine.pause(paused)
        trees = [engine.backend.parts.layout.config.data_dir / "snapshots" / snap,
                 engine.backend.parts.image_dir(paused)]
        paths = [str(t) for t in trees]
        for tree in trees:
            for folder, dirs, files in os.walk(tree):
                paths += [os.path.join(folder, n) for n in dirs + files]
        assert len(paths) > 40
        for stranger in (65534, 1000):
            assert _readable_as(stranger, paths) == []
        copies = str(trees[0] / "files")  # the sandbox's files, modes as it made them
        assert os.stat(copies).st_mode & 0o777 == 0o700
        for path in paths:  # each of the host's own, whatever its parents allow
            if path.startswith(copies + "/"):
                continue
            st = os.lstat(path)
            assert st.st_mode & 0o007 == 0, f"{path} is {oct(st.st_mode)}"
            assert st.st_mode & 0o070 == 0 or st.st_gid == HOST_ID_BASE, path
        images = {str(t / "image") for t in trees[:1]} | {str(trees[1])}
        for path in _readable_as(HOST_ID_BASE, paths):
            assert path.endswith(".img") and str(Path(path).parent) in images, path
    finally:
        engine.kill(paused, delete_volume=True)
        engine.delete_snapshot(snap)


def test_a_resumed_notebook_keeps_its_variables(engine: SandboxService) -> None:
    sandbox_id = engine.create(template="code-interpreter-v1").sandbox_id
    try:
        engine.run_code(sandbox_id, "secret = 41; import os; pid = os.getpid()")
        engine.pause(sandbox_id)
        out = engine.run_code(sandbox_id, "print(secret + 1, pid == os.getpid())")
        assert (out.stdout, out.kernel_restarted) == ("42 True\n", False), out
    finally:
        engine.kill(sandbox_id, delete_volume=True)


def test_snapshot_forks_and_their_independence(engine: SandboxService,
                                                busy: tuple[str, int]) -> None:
    sandbox_id, pid = busy
    snap = engine.snapshot(sandbox_id, "before")
    assert (snap.name, snap.sandbox_id, snap.template) == ("before", sandbox_id, "base")
    assert snap.size_bytes > 1 << 20
    assert engine.snapshot_info(snap.snapshot_id) == snap
    assert snap.snapshot_id in {s.snapshot_id for s in engine.list_snapshots()}
    with pytest.raises(SandboxError, match="snapshot's template"):
        engine.create(snapshot=snap.snapshot_id, template="code-interpreter-v1")
    # The parent ran on: same process, same server.
    assert _alive(engine, sandbox_id, pid)
    assert engine.run(sandbox_id, GET).stdout == "200\n"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        forks = list(pool.map(lambda _: engine.create(snapshot=snap.snapshot_id).sandbox_id,
                              range(2)))
    try:
        for fork in forks:
            assert _alive(engine, fork, pid), "the fork has no copy of the process"
            assert engine.run(fork, GET).stdout == "200\n"
            assert b"".join(engine.read_file(fork, "/workspace/note.txt")) == b"from the parent"
            assert engine.info(fork).template == "base"
            assert engine.run(fork, "hostname").stdout == f"{fork}\n", "the parent's name"
        engine.write_file(forks[0], "/workspace/note.txt", b"changed in a fork")
        for other in (forks[1], sandbox_id):
            assert b"".join(engine.read_file(other, "/workspace/note.txt")) == b"from the parent"
    finally:
        for fork in forks:
            engine.kill(fork, delete_volume=True)
    engine.delete_snapshot(snap.snapshot_id)
    with pytest.raises(NotFoundError):
        engine.snapshot_info(snap.snapshot_id)
    with pytest.raises(NotFoundError):
        engine.create(snapshot=snap.snapshot_id)


def _disk_used(engine: SandboxService, sandbox_id: str) -> int:
    parts = engine.backend.parts
    st = os.statvfs(parts.mode.disk_root(parts.row(sandbox_id)))
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_forks_share_the_snapshots_files_until_the_last_is_gone(
        engine: SandboxService, busy: tuple[str, int]) -> None:
    """A fork's disk holds only its changes: the snapshot's system layer and /workspace
    are read where the snapshot keeps them, through a snapshot of the fork and a fork of
    that, a reset, a kept volume attached again; a deleted snapshot's files stay until
    nothing reads them."""
    sandbox_id, _ = busy
    engine.run(sandbox_id, "head -c 8000000 /dev/urandom > /workspace/big && "
               "echo parent > /etc/marker")
    digest = engine.run(sandbox_id, "sha256sum < /workspace/big").stdout
    snaps = engine.backend.parts.layout.config.data_dir / "snapshots"
    snap = engine.snapshot(sandbox_id).snapshot_id
    live: list[str] = []
    try:
        fork = engine.create(snapshot=snap).sandbox_id
        live.append(fork)
        assert _disk_used(engine, fork) < 4_000_000, "the snapshot's files were copied"
        assert engine.run(fork, "sha256sum < /workspace/big").stdout == digest
        engine.run(fork, "echo fork > /etc/marker2 && echo fork > /workspace/note2")
        snap2 = engine.snapshot(fork).snapshot_id
        engine.delete_snapshot(snap)  # read by the fork and by snap2: hidden, kept
        assert snap not in {s.snapshot_id for s in engine.list_snapshots()}
        with pytest.raises(NotFoundError):
            engine.create(snapshot=snap)
        fork2 = engine.create(snapshot=snap2).sandbox_id
        live.append(fork2)
        assert engine.run(fork2, "cat /etc/marker /etc/marker2 /workspace/note2").stdout \
            == "parent\nfork\nfork\n"
        assert engine.run(fork2, "sha256sum < /workspace/big").stdout == digest
        engine.kill(fork, delete_volume=True)
        live.remove(fork)
        assert (snaps / snap).is_dir(), "snap2's system layer is over snap's"
        engine.reset_rootfs(fork2)  # its template's system layer; /workspace kept
        assert engine.run(fork2, "cat /etc/marker2 /workspace/note2 2>&1").stdout.endswith(
            "No such file or directory\nfork\n")
        volume = engine.info(fork2).volume_id
        engine.kill(fork2, delete_volume=False)
        live.remove(fork2)
        engine.delete_snapshot(snap2)
        again = engine.create(volume=volume).sandbox_id  # a kept volume of a fork
        live.append(again)
        assert engine.run(again, "cat /workspace/note2; sha256sum < /workspace/big").stdout \
            == "fork\n" + digest
        assert (snaps / snap2).is_dir() and (snaps / snap).is_dir()
        engine.kill(again, delete_volume=True)
        live.remove(again)
        assert not (snaps / snap2).exists() and not (snaps / snap).exists()
    finally:
        for left in live:
            engine.kill(left, delete_volume=True)
        engine.run(sandbox_id, "rm -f /workspace/big /etc/marker")


def test_a_refused_restore_leaves_it_paused_with_its_image(engine: SandboxService) -> None:
    sandbox_id = engine.create().sandbox_id
    try:
        engine.pause(sandbox_id)
        image = engine.backend.parts.image_dir(sandbox_id)
        tree = image / "pstree.img"
        saved = tree.read_bytes()
        tree.unlink()  # as a kernel refusing the image would: CRIU fails
        with pytest.raises(RuntimeUnavailableError, match="stays paused"):
            engine.resume(sandbox_id)
        assert engine.info(sandbox_id).state == "paused"
        assert engine.backend.runc.state(sandbox_id) is None, "half restored"
        tree.write_bytes(saved)
        assert engine.run(sandbox_id, "echo ok").stdout == "ok\n"
    finally:
        engine.kill(sandbox_id, delete_volume=True)


HOSTILE = {
    # a deleted file held open, and one written on after its unlink
    "deleted files": "python3 -c 'import os,time\nf=open(\"/tmp/gone\",\"w\")\n"
                     "f.write(\"x\"*100000)\nos.unlink(\"/tmp/gone\")\ntime.sleep(1e6)' "
                     ">/dev/null 2>&1 &",
    # a process tracing its own child
    "ptrace": "python3 -c 'import ctypes,os,time\nl=ctypes.CDLL(None)\npid=os.fork()\n"
              "if pid==0:\n l.ptrace(0,0,0,0); time.sleep(1e6)\n"
              "time.sleep(0.2); l.ptrace(16,pid,0,0); time.sleep(1e6)' >/dev/null 2>&1 &",
    # forks without end while it is checkpointed (the pids limit holds them)
    "fork bomb": "python3 -c 'import os,time\nwhile 1:\n try:\n  p=os.fork()\n"
                 "  if p==0: time.sleep(0.05); os._exit(0)\n except OSError: time.sleep(0.01)\n"
                 " try: os.waitpid(-1, os.WNOHANG)\n except OSError: pass' "
                 ">/dev/null 2>&1 &",
    # a socket to an address that is not there, and a unix socket pair
    "sockets": "python3 -c 'import socket,time\na,b=socket.socketpair()\n"
               "s=socket.socket(); s.setblocking(False)\n"
               "s.connect_ex((\"10.255.255.1\",80))\ntime.sleep(1e6)' >/dev/null 2>&1 &",
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_sandbox_breaking_its_own_checkpoint_hurts_nobody_else(
        engine: SandboxService, busy: tuple[str, int], attack: str) -> None:
    sandbox_id = engine.create(memory_mb=256).sandbox_id
    try:
        engine.run(sandbox_id, HOSTILE[attack])
        time.sleep(0.3)
        try:
            engine.pause(sandbox_id)
        except SandboxError as exc:
            # A clear error, and the sandbox runs (restarted, its files kept).
            assert "could not be paused" in str(exc)
            assert engine.info(sandbox_id).state == "running"
        else:
            engine.resume(sandbox_id)
        assert engine.run(sandbox_id, "echo ok").stdout == "ok\n"
        other, pid = busy
        assert _alive(engine, other, pid) and engine.run(other, GET).stdout == "200\n"
    finally:
        engine.kill(sandbox_id, delete_volume=True)


def test_huge_memory_is_checkpointed_within_its_limit(engine: SandboxService) -> None:
    sandbox_id = engine.create(memory_mb=256).sandbox_id
    try:
        engine.run(sandbox_id, "python3 -c 'import time\nx=bytearray(150<<20)\n"
                   "x[::4096]=b\"\\1\"*len(x[::4096])\ntime.sleep(1e6)' >/dev/null 2>&1 &")
        time.sleep(1.0)
        engine.pause(sandbox_id)
        image = engine.backend.parts.image_dir(sandbox_id)
        size = sum(p.stat().st_size for p in image.glob("pages-*.img"))
        assert size >= 100 << 20, size
        assert engine.run(sandbox_id, "pgrep -f bytearray >/dev/null && echo ok").stdout \
            == "ok\n"
    finally:
        engine.kill(sandbox_id, delete_volume=True)
    assert not image.exists()


def test_the_setup_builds_kernel_cache_is_a_private_tmpfs(tmp_path: Path) -> None:
    """CRIU caches the kernel's features only on a tmpfs: the setup's build keeps them in
    run/ beside its bin/, which the engine mounts as one (root's alone); any other CRIU's
    folders are left as they are."""
    from agent_sandbox.backends.runc import criu
    from agent_sandbox.backends.runc.rootfs.overlay import unmount_rootfs

    if os.geteuid() != 0:
        pytest.skip("mounts need root")
    (tmp_path / "bin").mkdir()
    (tmp_path / "run").mkdir(mode=0o700)
    criu.keep_kernel_cache(str(tmp_path / "bin" / "criu"))
    try:
        assert os.path.ismount(tmp_path / "run")
        assert subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path / "run")],
                              capture_output=True, text=True).stdout.strip() == "tmpfs"
        assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    finally:
        unmount_rootfs(tmp_path / "run")
    criu.keep_kernel_cache(str(tmp_path / "usr" / "sbin" / "criu"))  # no run/ beside it
    assert not (tmp_path / "usr").exists()


def test_memory_backend_and_bad_ids_refuse_clearly() -> None:
    from agent_sandbox.backends.kubernetes.backend import KubernetesBackend
    from agent_sandbox.backends.memory.backend import MemoryBackend

    assert "runc engine" in MemoryBackend.snapshot_refusal
    assert "pauses files only" in KubernetesBackend.snapshot_refusal
    engine = local_provider()
    for bad in ("snap-", "../x", "snap-ABCDEFGHIJ", 7):
        with pytest.raises(SandboxError, match="invalid snapshot id"):
            engine.snapshot_info(bad)  # type: ignore[arg-type]
    with pytest.raises(NotFoundError, match="snapshot snap-0123456789 not found"):
        engine.create(snapshot="snap-0123456789")
