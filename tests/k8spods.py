"""What the hostile Kubernetes tests (tests/kubernetes/test_k8s_hostile*.py) share: python
run inside a sandbox, and its Pod as the cluster (and this host, the test cluster's
nodes) sees it."""

from __future__ import annotations

import base64
import contextlib
import glob
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from syscall_prelude import PRELUDE

from agent_sandbox import Sandbox
from agent_sandbox.backends.kubernetes import objects

# The python run inside starts with test_hostile.py's prelude (tests/syscall_prelude.py).


def py(sb: Sandbox, code: str, timeout: float = 30) -> Any:
    """Run python inside; it prints one JSON document, returned decoded."""
    res = sb.commands.run("python3 -", stdin=PRELUDE + code, timeout=timeout)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def provider_env(cluster: Any) -> Iterator[Any]:
    """The settings that make ``Sandbox.create()`` a Pod of the session's namespace."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in cluster.env.items():
            mp.setenv(name, value)
        mp.setenv("ABX_POOL_SIZE", "0")
        yield cluster


def quiet_kill(sb: Sandbox) -> None:
    try:
        sb.kill(delete_volume=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


def pods_of(cluster: Any, sandbox_id: str) -> list[Any]:
    return cluster.core().list_namespaced_pod(
        cluster.namespace, label_selector=f"{objects.LABEL_SANDBOX}={sandbox_id}").items


def running_pod(cluster: Any, sandbox_id: str) -> Any:
    """The running Pod of a sandbox (a V1Pod)."""
    pods = pods_of(cluster, sandbox_id)
    running = [p for p in pods if p.metadata.deletion_timestamp is None
               and p.status.phase == "Running"]
    assert len(running) == 1, [(p.metadata.name, p.status.phase) for p in pods]
    return running[0]


def guest_token(cluster: Any, sandbox_id: str) -> str:
    secret = cluster.core().read_namespaced_secret(objects.secret_name(sandbox_id),
                                                   cluster.namespace)
    return base64.b64decode(secret.data[objects.TOKEN_KEY]).decode()


def pod_cgroup(pod: Any, knob: str) -> Path | None:
    """A file of the Pod's own cgroup (``pids.max``...) on its node, here; None when the
    node's cgroups are not on this host."""
    uid = pod.metadata.uid
    for pattern in (f"/sys/fs/cgroup/*/*/kubepods/pod{uid}",  # v1: controller/root/...
                    f"/sys/fs/cgroup/*/*/kubepods/*/pod{uid}",
                    f"/sys/fs/cgroup/*/kubepods/pod{uid}",  # v1 at the top, or v2
                    f"/sys/fs/cgroup/*/kubepods/*/pod{uid}"):
        for found in sorted(glob.glob(pattern)):
            if Path(found, knob).is_file():
                return Path(found, knob)
    return None
