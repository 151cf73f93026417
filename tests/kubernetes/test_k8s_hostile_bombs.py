"""Resource bombs inside Pod sandboxes (tests/runtime/test_hostile.py's fork, memory and
disk bombs): each stays in its Pod, which answers again afterwards (or is replaced by
the provider), while another sandbox and the host carry on throughout.

Gaps of the test cluster (tests/kubernetes/test_k8s_hostile.py says more):
- pids: only the kubelet's podPidsLimit caps a Pod's processes (a Pod spec cannot);
  scripts/k8s/node.sh sets 1024 from the cluster's next ``up``. On a node still without
  it, the bounded fork loop checks what is true (its processes are the Pod's, in its
  cgroup) and the unbounded fork bomb skips: it would exhaust the host's pids.
- disk: /workspace is a hostPath volume here, without quota; what the sandbox writes to
  its root is capped by the Pod's ephemeral-storage limit, and that is what is bombed.
The two sandboxes here are each other's bystander; they may share a node or not.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from k8spods import pod_cgroup, provider_env, py, quiet_kill, running_pod

from agent_sandbox import Sandbox

pytestmark = [pytest.mark.integration, pytest.mark.slow]
EAGAIN = 11
MB = 1 << 20
UNLIMITED_FORKS = 400  # the fork loop's bound where no pids limit is in force

# Forks until refused (or CAP), holds every child for HOLD s, then reports.
_FORK_LOOP = """
import json, os, sys, time
CAP, HOLD, OUT = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
r, w = os.pipe()
made, err = 0, None
while made < CAP:
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)  # until the parent lets go
        os._exit(0)
    made += 1
counted = -1
for knob in ("/sys/fs/cgroup/pids/pids.current", "/sys/fs/cgroup/pids.current"):
    if os.path.exists(knob):
        counted = int(open(knob).read())
        break
time.sleep(HOLD)
os.close(w)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
report = {"made": made, "errno": err, "counted": counted,
          "cgroup": open("/proc/self/cgroup").read()}
with open(OUT + ".part", "w") as f:
    json.dump(report, f)
os.rename(OUT + ".part", OUT)
"""

# The classic, in a session of its own, killed as a group after SECONDS.
_CLASSIC = """
import os, signal, subprocess, sys, time
bomb = subprocess.Popen(["sh", "-c", "b(){ b|b& }; b"], start_new_session=True)
time.sleep(float(sys.argv[1]))
for _ in range(50):
    try:
        os.killpg(bomb.pid, signal.SIGKILL)
    except ProcessLookupError:
        break
    time.sleep(0.1)
bomb.wait()
"""


@pytest.fixture(scope="module")
def cluster(k8s_cluster: Any) -> Iterator[Any]:
    with provider_env(k8s_cluster):
        yield k8s_cluster


@pytest.fixture(scope="module")
def big(cluster: Any) -> Iterator[Sandbox]:
    """Default limits: the fork bombs' target, the other bombs' bystander."""
    sb = Sandbox.create(timeout=1800)
    yield sb
    quiet_kill(sb)


@pytest.fixture(scope="module")
def small(cluster: Any) -> Iterator[Sandbox]:
    """Little memory and disk: the memory and disk bombs' target (its Pod may be
    replaced), the fork bombs' bystander."""
    sb = Sandbox.create(memory_mb=128, disk_mb=64, timeout=1800)
    yield sb
    quiet_kill(sb)


def _eventually(what: str, seconds: float, check: Callable[[], bool]) -> None:
    """check() until it holds; a guest that is busy or being replaced may fail meanwhile."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not answering yet
            pass
        assert time.monotonic() < deadline, f"{what}: not within {seconds:.0f} s"
        time.sleep(1)


def _bystander_alive(sb: Sandbox, pid: int) -> None:
    """The other sandbox answers, and its process from before is still there."""
    assert sb.commands.run(f"kill -0 {pid} && echo alive", timeout=20).stdout == "alive\n"
    subprocess.run(["true"], check=True, timeout=20)  # the host still forks


def _process_count(sb: Sandbox) -> int:
    return int(py(sb, "print(sum(p.isdigit() for p in os.listdir('/proc')))", timeout=10))


def _pids(pod: Any) -> tuple[int | None, Path | None]:
    """The Pod's pids limit (None: unlimited or unknown) and its count's file, here."""
    knob = pod_cgroup(pod, "pids.max")
    limit = knob.read_text().strip() if knob else ""
    return (int(limit) if limit.isdigit() else None), pod_cgroup(pod, "pids.current")


def _count(current: Path) -> int:
    try:
        return int(current.read_text())
    except OSError:  # the Pod's cgroup is gone: so are its processes
        return 0


class _Peak:
    """The most processes the Pod's cgroup held while the block ran, sampled every 20 ms
    from this host: a bomb's peak at the limit can last well under a second."""

    def __init__(self, current: Path) -> None:
        self.current, self.most = current, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.most = max(self.most, _count(self.current))

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _through(current: Path | None, limit: int) -> None:
    """Wait (from this host, asking the guest nothing: it has no thread to spare then)
    until the Pod's processes reached its limit and went away again."""
    if current is None:
        time.sleep(10)
        return
    _eventually("the Pod reaching its pids limit", 30,
                lambda: _count(current) > limit - 64 or not current.exists())
    _eventually("the Pod's processes ending", 60, lambda: _count(current) < 64)


def test_fork_loop_stays_in_its_pod(cluster: Any, big: Sandbox, small: Sandbox) -> None:
    pod = running_pod(cluster, big.sandbox_id)
    limit, current = _pids(pod)
    cap = limit + 64 if limit else UNLIMITED_FORKS
    watch = small.commands.run("sleep 600", background=True)
    try:
        big.files.write("/tmp/fork.py", _FORK_LOOP)
        # Held 15 s: long enough for this host to see the Pod at its limit, even loaded.
        big.commands.run(f"python3 /tmp/fork.py {cap} 15 /tmp/fork.json", background=True)
        time.sleep(2)  # its children held meanwhile
        _bystander_alive(small, watch.pid)
        if limit:
            _through(current, limit)
            assert current is None or current.exists(), \
                "the Pod ended at its pids limit: its guest died with no thread to spare"
        report: dict[str, Any] = {}

        def reported() -> bool:
            report.update(json.loads(big.commands.run("cat /tmp/fork.json",
                                                      timeout=10).stdout))
            return True

        _eventually("the fork loop's report", 60, reported)
    finally:
        watch.kill()
    # Its processes were the Pod's: counted in the Pod's own cgroup.
    pids_line = next(ln for ln in report["cgroup"].splitlines()
                     if ln.split(":")[1] in ("pids", ""))
    assert f"pod{pod.metadata.uid}" in pids_line, report["cgroup"]
    if limit:
        assert report["errno"] == EAGAIN and report["made"] < limit, (limit, report)
    else:
        assert report["made"] == cap and report["errno"] is None, report
    assert report["counted"] >= report["made"], report
    _eventually("the sandbox answering again", 30, lambda: _process_count(big) < 10)
    # Its guest lived through it: the same Pod answers.
    assert running_pod(cluster, big.sandbox_id).metadata.name == pod.metadata.name


def test_fork_bomb_is_contained(cluster: Any, big: Sandbox, small: Sandbox) -> None:
    pod = running_pod(cluster, big.sandbox_id)
    limit, current = _pids(pod)
    if limit is None or current is None:
        pytest.skip(f"the kubelet of node {pod.spec.node_name} runs without podPidsLimit "
                    "(a Pod's pids are unbounded: the bomb would exhaust the host's); "
                    "scripts/k8s_cluster.sh up sets it")
    watch = small.commands.run("sleep 600", background=True)
    try:
        big.files.write("/tmp/bomb.py", _CLASSIC)
        with _Peak(current) as peak:
            big.commands.run("python3 /tmp/bomb.py 6", background=True)
            time.sleep(2)
            assert _count(current) <= limit
            _bystander_alive(small, watch.pid)
            _eventually("the Pod reaching its pids limit", 30,
                        lambda: peak.most > limit - 64 or not current.exists())
        _eventually("the Pod's processes ending", 60, lambda: _count(current) < 64)
    finally:
        watch.kill()
    # Usable again: its guest lived through it, or the provider gave it a new Pod.
    _eventually("the sandbox usable after the bomb", 60, lambda: _process_count(big) < 10)
    assert big.commands.run("echo ok").stdout == "ok\n"


def test_memory_bomb_kills_only_the_offender(cluster: Any, big: Sandbox,
                                             small: Sandbox) -> None:
    limit = py(small, """
for knob in ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"):
    if os.path.exists(knob):
        print(json.dumps(int(open(knob).read()))); break
""")
    assert limit == 128 * MB
    watch = big.commands.run("sleep 600", background=True)
    try:
        res = small.commands.run(
            "python3 -c 'b = bytearray(1 << 30); b[::4096] = b\"x\" * (1 << 18)'", timeout=60)
        assert res.exit_code == 137 or "MemoryError" in res.stderr, res
        _bystander_alive(big, watch.pid)
    finally:
        watch.kill()
    # Its guest survived (the offender was the biggest), or the provider replaced its Pod.
    _eventually("the sandbox answering after the bomb", 60,
                lambda: small.commands.run("echo ok", timeout=10).stdout == "ok\n")


def test_disk_fill_outside_workspace_evicts_only_the_offender(
        cluster: Any, big: Sandbox, small: Sandbox) -> None:
    small.files.write("/workspace/kept", "kept")
    old = running_pod(cluster, small.sandbox_id).metadata.name
    watch = big.commands.run("sleep 600", background=True)
    try:
        try:  # 2.5 times its disk, outside /workspace: its root's writable layer
            small.commands.run("python3 -c 'f = open(\"/tmp/big\", \"wb\")\n"
                               "for _ in range(160): f.write(bytes(1 << 20))'", timeout=60)
        except Exception:  # noqa: BLE001 - evicted while writing: fine
            pass

        def evicted() -> bool:
            events = cluster.core().list_namespaced_event(
                cluster.namespace, field_selector=f"involvedObject.name={old}").items
            return any(e.reason == "Evicted" for e in events)

        _eventually("the kubelet evicting the Pod", 120, evicted)
        _bystander_alive(big, watch.pid)
    finally:
        watch.kill()
    # Replaced on its volume by the provider: a fresh root, the workspace kept.
    _eventually("the sandbox replaced", 90, lambda: small.commands.run(
        "test -e /tmp/big && echo there || echo gone", timeout=10).stdout == "gone\n")
    assert running_pod(cluster, small.sandbox_id).metadata.name != old
    assert small.files.read("/workspace/kept") == "kept"
