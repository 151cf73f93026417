"""The Kubernetes objects of a sandbox, built without a cluster: what isolates it."""

from __future__ import annotations

import base64
import json

import pytest

from agent_sandbox.backends.kubernetes import objects
from agent_sandbox.backends.kubernetes.backend import _mib
from agent_sandbox.backends.kubernetes.pods import live_of, row_of
from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.network import parse
from agent_sandbox.core.network import parse as parse_policy
from agent_sandbox.core.states import SandboxState
from agent_sandbox.service.record import SandboxRecord


def _row(**kw: object) -> SandboxRecord:
    base = dict(id="sbx-abcdefghij", template="base", state=SandboxState.RUNNING,
                created_at=1.0, last_used=2.0, timeout=300.0, persistent=False,
                network=parse("off"), volume_id="vol-abcdefghij",
                envs={"A": "1"}, metadata={"k": "v"},
                limits={"cpu": 0.5, "memory_mb": 256, "disk_mb": 64, "pids": 512},
                owner="key-1")
    base.update(kw)
    return SandboxRecord(**base)  # type: ignore[arg-type]


def test_pod_runs_the_guest_unprivileged_with_its_token_from_the_secret() -> None:
    pod = objects.pod(_row(), "abx.local/base:1", pull_policy="Never", runtime_class="")
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for forbidden in ("hostNetwork", "hostPID", "hostIPC", "runtimeClassName"):
        assert forbidden not in spec
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert not {"SYS_ADMIN", "NET_ADMIN", "NET_RAW", "SYS_PTRACE", "MKNOD"} & set(
        sc["capabilities"]["add"])
    assert c["env"] == [{"name": "ABX_GUEST_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "abx-sbx-abcdefghij", "key": "token"}}}]
    assert c["command"][-2:] == ["--tcp", f"0.0.0.0:{objects.GUEST_PORT}"]
    assert c["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi",
                                        "ephemeral-storage": "64Mi"}
    assert c["resources"]["requests"] == {"cpu": "50m", "memory": "64Mi",
                                          "ephemeral-storage": "16Mi"}
    assert c["imagePullPolicy"] == "Never"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/workspace"] == "workspace"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["workspace"]["persistentVolumeClaim"]["claimName"] == "abx-vol-abcdefghij"



def test_pod_caps_what_it_writes_to_the_node_disk() -> None:
    """The root's writable layer lives on the node's disk: without an ephemeral-storage
    limit one sandbox could fill it (found by tests/kubernetes/test_k8s_hostile.py)."""
    pod = objects.pod(_row(limits={"cpu": 1, "memory_mb": 1024, "disk_mb": 2048}), "img",
                      pull_policy="Never", runtime_class="")
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"]["ephemeral-storage"] == "2048Mi"
    assert resources["requests"]["ephemeral-storage"] == "512Mi"
    # The guest's run directory is memory (counted against the memory limit), not disk.
    run = {v["name"]: v for v in pod["spec"]["volumes"]}["run"]
    assert run["emptyDir"]["medium"] == "Memory"

def test_runtime_class_is_passed_when_asked() -> None:
    pod = objects.pod(_row(), "img", pull_policy="IfNotPresent", runtime_class="gvisor")
    assert pod["spec"]["runtimeClassName"] == "gvisor"


def test_secret_holds_the_token_and_the_record_reads_back() -> None:
    row = _row(network=parse(["203.0.113.0/24"]))
    secret = objects.secret(row, "tok", "running")
    assert secret["stringData"] == {"token": "tok"}
    assert "tok" not in json.dumps(secret["metadata"])
    # As the API answers it: data base64, uid and version set.
    answered = {"metadata": {**secret["metadata"], "uid": "u1", "resourceVersion": "7"},
                "data": {"token": base64.b64encode(b"tok").decode()}}
    back = row_of(answered)
    assert back == row
    live = live_of(answered, [])
    assert live.token == "tok" and live.pod is None and live.version == "7"


def test_live_takes_the_newest_pod_that_can_run() -> None:
    row = _row()
    secret = {"metadata": {**objects.secret(row, "t", "running")["metadata"], "uid": "u",
                           "resourceVersion": "1"}, "data": {}}
    old = {"metadata": {"name": "p-old", "creationTimestamp": "2026-01-01T00:00:00Z"},
           "status": {"podIP": "10.0.0.1", "phase": "Running"}, "spec": {"nodeName": "n1"}}
    dying = {"metadata": {"name": "p-dying", "creationTimestamp": "2026-01-03T00:00:00Z",
                          "deletionTimestamp": "x"}, "status": {"podIP": "10.0.0.3"}}
    new = {"metadata": {"name": "p-new", "creationTimestamp": "2026-01-02T00:00:00Z"},
           "status": {"podIP": "10.0.0.2", "phase": "Running"}, "spec": {"nodeName": "n2"}}
    live = live_of(secret, [old, dying, new])
    assert (live.pod, live.ip, live.node) == ("p-new", "10.0.0.2", "n2")


def test_network_policy_follows_the_sandbox_policy() -> None:
    off = objects.network_policy(_row())
    assert off["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert off["spec"]["egress"] == []
    assert off["spec"]["ingress"] == [{"ports": [{"port": objects.GUEST_PORT,
                                                  "protocol": "TCP"}]}]
    full = objects.egress_rules(parse({"mode": "full", "deny_out": ["198.51.100.7/32"]}))
    v4 = full[0]["to"][0]["ipBlock"]
    assert v4["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "169.254.0.0/16", "198.51.100.7/32"} <= set(v4["except"])
    allow = objects.egress_rules(parse(["203.0.113.0/24"]))
    assert allow == [{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}]


def test_names_cannot_be_enforced_by_a_network_policy() -> None:
    with pytest.raises(InvalidArgumentError, match="not names"):
        objects.check_enforceable(parse_policy(["pypi.org"]))
    with pytest.raises(InvalidArgumentError):
        objects.check_enforceable(parse_policy("registries"))
    assert objects.check_enforceable(parse_policy(True)) is None  # full: addresses only


def test_volume_sizes_read_back_in_mib() -> None:
    assert _mib("64Mi") == 64 and _mib("2Gi") == 2048 and _mib(str(3 << 20)) == 3
    assert _mib("junk") == 0


def test_hostpath_volume_is_bound_to_its_own_claim() -> None:
    pv = objects.hostpath_pv("vol-x", 64, "/srv/abx/", "ns1")
    claim = objects.pvc("vol-x", 64, "fast", "sbx-1", hostpath=True)
    assert pv["spec"]["claimRef"] == {"namespace": "ns1", "name": "abx-vol-x"}
    assert pv["spec"]["hostPath"]["path"] == "/srv/abx/vol-x"
    assert claim["spec"]["volumeName"] == "abx-vol-x"
    assert claim["spec"]["storageClassName"] == ""
    assert objects.pvc("vol-x", 64, "fast", "", hostpath=False)["spec"][
        "storageClassName"] == "fast"
