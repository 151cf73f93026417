"""The Kubernetes objects of one sandbox, as manifests (plain dicts).

- a Secret ``abx-<id>``: the guest's token, and the sandbox's record in its annotations
  (the provider keeps no local-only state: a restarted provider reads these back);
- a PersistentVolumeClaim ``abx-vol-<n>``: /workspace, kept on kill unless asked;
- a Pod ``abx-<id>``: our guest agent as its entrypoint, on TCP with that token;
  unprivileged as far as the guest allows (no privilege escalation, capabilities dropped
  to what running commands as the sandbox's accounts needs, seccomp RuntimeDefault, no
  service-account token, no host namespaces), its memory, CPU and node disk capped;
- a NetworkPolicy ``abx-<id>``: ingress only to the guest port, egress as the sandbox's
  network policy allows (addresses only; enforced where the cluster's CNI does).
"""

from __future__ import annotations

import json
from typing import Any

from agent_sandbox.core.errors import InvalidArgumentError
from agent_sandbox.core.inside import CAPABILITIES, GUEST_DIR, GUEST_RUN_DIR
from agent_sandbox.core.netrules import BLOCKED_V4, BLOCKED_V6
from agent_sandbox.core.network import NetworkPolicy
from agent_sandbox.service.record import SandboxRecord

GUEST_PORT = 49982
GROUP = "abx.dev"
LABEL_ROLE = f"{GROUP}/role"  # "sandbox": every object of a sandbox
LABEL_SANDBOX = f"{GROUP}/sandbox"
LABEL_TEMPLATE = f"{GROUP}/template"
LABEL_STATE = f"{GROUP}/state"  # on the Secret: running | paused | pooled
LABEL_VOLUME = f"{GROUP}/volume"
RECORD = f"{GROUP}/record"  # annotation: the sandbox's SandboxRecord as JSON
ATTACHED = f"{GROUP}/attached-to"  # annotation of a volume's PVC
MANAGED = {"app.kubernetes.io/managed-by": "agent-sandbox"}
TOKEN_KEY = "token"
_BOOT = f"import sys; sys.path.insert(0, {GUEST_DIR!r}); import agent; agent.main()"
# Commands run as the sandbox's accounts (setuid/setgid), own the files made for them and
# may be signalled: what the guest needs of CAPABILITIES, less nothing else.
_CAPS = [c.removeprefix("CAP_") for c in CAPABILITIES]


def pod_name(sandbox_id: str) -> str:
    return f"abx-{sandbox_id}"


def secret_name(sandbox_id: str) -> str:
    return f"abx-{sandbox_id}"


def pvc_name(volume_id: str) -> str:
    return f"abx-{volume_id}"


def record_json(row: SandboxRecord) -> str:
    data = {k: getattr(row, k) for k in ("id", "template", "created_at", "timeout",
                                        "persistent", "volume_id", "envs", "metadata",
                                        "limits", "owner", "last_used", "lifetime",
                                        "on_timeout", "keep_volume")}
    data["network"] = row.network.model_dump(mode="json")
    return json.dumps(data, sort_keys=True)


def secret(row: SandboxRecord, token: str, state: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": secret_name(row.id),
                     "labels": {**MANAGED, LABEL_ROLE: "sandbox", LABEL_SANDBOX: row.id,
                                LABEL_TEMPLATE: row.template, LABEL_STATE: state},
                     "annotations": {RECORD: record_json(row)}},
        "stringData": {TOKEN_KEY: token},
    }


def pvc(volume_id: str, size_mb: int, storage_class: str, attached_to: str,
        hostpath: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": f"{size_mb}Mi"}}}
    if hostpath:  # bound to its own PersistentVolume (pv() below), nothing else
        spec["storageClassName"] = ""
        spec["volumeName"] = pvc_name(volume_id)
    elif storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": pvc_name(volume_id),
                         "labels": {**MANAGED, LABEL_VOLUME: volume_id},
                         "annotations": {ATTACHED: attached_to}},
            "spec": spec}


def hostpath_pv(volume_id: str, size_mb: int, directory: str, namespace: str,
                claim_uid: str = "") -> dict[str, Any]:
    """A PersistentVolume for a cluster with no provisioner (the test cluster)."""
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pvc_name(volume_id),
                         "labels": {**MANAGED, LABEL_VOLUME: volume_id}},
            "spec": {"capacity": {"storage": f"{size_mb}Mi"},
                     "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain",
                     "storageClassName": "",
                     "claimRef": {"namespace": namespace, "name": pvc_name(volume_id),
                                  **({"uid": claim_uid} if claim_uid else {})},
                     "hostPath": {"path": f"{directory.rstrip('/')}/{volume_id}",
                                  "type": "DirectoryOrCreate"}}}


def owned_by(secret: dict[str, Any]) -> dict[str, Any]:
    """An ownerReference to the sandbox's Secret: deleting it deletes the rest (the
    cluster's garbage collector), so nothing outlives a record, whoever removed it."""
    return {"apiVersion": "v1", "kind": "Secret", "name": secret["metadata"]["name"],
            "uid": secret["metadata"]["uid"], "blockOwnerDeletion": False}


def pod(row: SandboxRecord, image: str, *, pull_policy: str, runtime_class: str
        ) -> dict[str, Any]:
    """The sandbox's Pod."""
    cpu_m = int(float(row.limits.get("cpu", 1)) * 1000)
    memory = int(row.limits.get("memory_mb", 1024))
    disk = int(row.limits.get("disk_mb", 1024))
    # ephemeral-storage: what the sandbox writes outside /workspace (its root's writable
    # layer, on the node's disk) is capped at its disk size too; past it the kubelet
    # evicts the Pod (the provider then starts a new one on the volume). Without it one
    # sandbox could fill the node's disk, and node-pressure eviction hits its neighbours.
    limits = {"cpu": f"{cpu_m}m", "memory": f"{memory}Mi", "ephemeral-storage": f"{disk}Mi"}
    # Sandboxes idle most of their life: the scheduler counts a tenth of their CPU and a
    # quarter of their memory and disk (the limits still cap each one).
    requests = {"cpu": f"{max(10, cpu_m // 10)}m", "memory": f"{max(32, memory // 4)}Mi",
                "ephemeral-storage": f"{max(16, disk // 4)}Mi"}
    workspace = {"persistentVolumeClaim": {"claimName": pvc_name(row.volume_id)}}
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "hostname": row.id,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        # A node that stops answering gives its Pods up in 10 s (not 5 min): the
        # provider then reports the sandbox lost instead of waiting on it.
        "tolerations": [{"key": f"node.kubernetes.io/{t}", "operator": "Exists",
                         "effect": "NoExecute", "tolerationSeconds": 10}
                        for t in ("not-ready", "unreachable")],
        "containers": [{
            "name": "sandbox", "image": image, "imagePullPolicy": pull_policy,
            "command": ["/usr/bin/python3", "-I", "-S", "-X", "utf8", "-c", _BOOT,
                        "--tcp", f"0.0.0.0:{GUEST_PORT}"],
            "env": [{"name": "ABX_GUEST_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": secret_name(row.id), "key": TOKEN_KEY}}}],
            "ports": [{"containerPort": GUEST_PORT, "name": "guest"}],
            "workingDir": "/",
            "resources": {"requests": requests, "limits": limits},
            # No probe: the provider pings the guest itself when it starts the Pod, and a
            # probe's connection every second would cost the guest a thread it may not
            # get when the sandbox's processes hold every pid.
            "securityContext": {
                "allowPrivilegeEscalation": False, "privileged": False,
                "capabilities": {"drop": ["ALL"], "add": _CAPS},
                "runAsUser": 0, "runAsNonRoot": False,
            },
            "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"},
                             {"name": "run", "mountPath": GUEST_RUN_DIR}],
        }],
        "volumes": [{"name": "workspace", **workspace},
                    {"name": "run", "emptyDir": {"medium": "Memory",
                                                 "sizeLimit": "64Mi"}}],
    }
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    labels = {**MANAGED, LABEL_ROLE: "sandbox", LABEL_SANDBOX: row.id,
              LABEL_TEMPLATE: row.template}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(row.id), "labels": labels}, "spec": spec}


def network_policy(row: SandboxRecord) -> dict[str, Any]:
    """Ingress to the guest port only; egress per the sandbox's policy, by address (a
    NetworkPolicy cannot name hosts: named entries are refused at create)."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": pod_name(row.id), "labels": dict(MANAGED)},
            "spec": {"podSelector": {"matchLabels": {LABEL_SANDBOX: row.id}},
                     "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"ports": [{"port": GUEST_PORT, "protocol": "TCP"}]}],
                     "egress": egress_rules(row.network)}}


def egress_rules(policy: NetworkPolicy) -> list[dict[str, Any]]:
    if policy.mode == "off":
        return []
    if policy.mode == "full":
        denied = [c for c in policy.deny_out if "/" in c]
        v4 = [*BLOCKED_V4, *(c for c in denied if ":" not in c)]
        v6 = [*BLOCKED_V6, *(c for c in denied if ":" in c)]
        return [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": v4}},
                        {"ipBlock": {"cidr": "::/0", "except": v6}}]}]
    return [{"to": [{"ipBlock": {"cidr": cidr}} for cidr in policy.allow_out]}]


def check_enforceable(policy: NetworkPolicy) -> None:
    """Refuse a policy a NetworkPolicy cannot hold (it takes addresses, not names)."""
    names = names_in(policy)
    if names:
        raise InvalidArgumentError(
            f"a Kubernetes NetworkPolicy allows or denies addresses, not names: "
            f"{names[:5]} cannot be enforced on a cluster; give CIDRs (e.g. "
            "'203.0.113.0/24'), 'full' or 'off'")


def names_in(policy: NetworkPolicy) -> list[str]:
    """The entries of ``policy`` a NetworkPolicy cannot express (host names)."""
    return [e for e in (*policy.allow_out, *policy.deny_out) if "/" not in e]
