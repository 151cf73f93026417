"""The manifests of ``abx mcp deploy --target kubernetes-gateway``: the gateway (``abx serve``,
``ABX_ENGINE=kubernetes``) inside the cluster it serves. Pure functions of ``Gateway``.

The gateway's rights are exactly the API calls the Kubernetes provider makes
(backends/kubernetes/cluster.py and the catalog's read; a unit test derives them from
that code): namespaced objects of its own namespace only, plus listing nodes (the
supervisor replaces the Pods of a node that stopped answering) and, only with
``--hostpath-dir``, creating and deleting PersistentVolumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_sandbox.backends.kubernetes.objects import GUEST_PORT, LABEL_ROLE

NAME = "abx-gateway"
APP_LABEL = "app.kubernetes.io/name"
LABELS = {APP_LABEL: NAME, "app.kubernetes.io/part-of": "agent-sandbox"}
PORT = 8080
UID = 10001  # the image's user (Dockerfile): the gateway needs no root
DATA_DIR = "/var/lib/agent-sandbox"  # ABX_DATA_DIR: the key database, kernel bookkeeping
KEYS_DB = "gateway-keys.db"
SEED_DIR = "/etc/abx/keys-seed"
KEYS_SECRET = f"{NAME}-keys"
DATA_CLAIM = f"{NAME}-data"
BASELINE_POLICY = "abx-sandbox-baseline"
TEMPLATES_CONFIGMAP = "abx-templates"  # backends/kubernetes/catalog.py

# What the provider calls, as RBAC rules: (apiGroup, resource, verbs).
NAMESPACED_RULES = (
    ("", "pods", ("create", "delete", "get", "list", "patch")),
    ("", "secrets", ("create", "delete", "get", "list", "patch")),
    ("", "persistentvolumeclaims", ("create", "delete", "get", "list", "patch")),
    # replace_namespaced_network_policy is the "update" verb
    ("networking.k8s.io", "networkpolicies", ("create", "delete", "update")),
)
# The template catalog: read, one ConfigMap by name (`abx template push` writes it, with
# the pusher's own credentials).
CATALOG_RULE = ("", "configmaps", ("get",))
NODE_RULE = ("", "nodes", ("list",))  # the supervisor's lost-node check
HOSTPATH_RULE = ("", "persistentvolumes", ("create", "delete"))  # --hostpath-dir only

# The initContainer: the key database is seeded from the Secret once, when the data
# volume has none (keys made later, and volume ownership, live on the volume).
SEED_SCRIPT = (
    'set -eu\n'
    'db="$ABX_DATA_DIR/' + KEYS_DB + '"\n'
    'if [ -e "$db" ]; then echo "abx: $db exists; the seed is not used"; exit 0; fi\n'
    'umask 077\n'
    'cat "$KEYS_SEED_FILE" > "$db.seed"\n'
    'mv "$db.seed" "$db"\n'
    'echo "abx: seeded $db from the Secret ' + KEYS_SECRET + '"\n'
)


@dataclass(frozen=True)
class Gateway:
    namespace: str
    image: str
    create_namespace: bool = True
    pull_policy: str = ""  # the gateway's and the sandboxes' imagePullPolicy ("": default)
    hostpath_dir: str = ""
    storage_class: str = ""
    runtime_class: str = ""

    @property
    def cluster_role_prefix(self) -> str:
        # Cluster-scoped names: one per namespace, so two gateways never share one.
        return f"{NAME}-{self.namespace}"


def describe(rules: tuple[tuple[str, str, tuple[str, ...]], ...]) -> str:
    """Rules as a person reads them: ``pods (create, delete)``."""
    return ", ".join(f"{resource} ({', '.join(verbs)})" for _, resource, verbs in rules)


def _meta(g: Gateway, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": g.namespace, "labels": dict(LABELS), **extra}


def _rules(*rules: tuple[str, str, tuple[str, ...]]) -> list[dict[str, Any]]:
    return [{"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
            for group, resource, verbs in rules]


def namespace(g: Gateway) -> dict[str, Any]:
    # Sandbox Pods run as root with a few capabilities, all within "baseline" (enforced
    # from Kubernetes 1.23; an unknown label before).
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": g.namespace, "labels": {
                **LABELS, "pod-security.kubernetes.io/enforce": "baseline"}}}


def rbac(g: Gateway) -> list[dict[str, Any]]:
    """ServiceAccount, its Role in the namespace, and the two narrow cluster rights."""
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": g.namespace}]
    role_rules = _rules(*NAMESPACED_RULES)
    role_rules.append({**_rules(CATALOG_RULE)[0], "resourceNames": [TEMPLATES_CONFIGMAP]})
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(g, NAME),
         "automountServiceAccountToken": True},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": _meta(g, NAME), "rules": role_rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(g, NAME), "subjects": subject,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME}},
    ]
    cluster = [("nodes", NODE_RULE)]
    if g.hostpath_dir:
        cluster.append(("volumes", HOSTPATH_RULE))
    for suffix, rule in cluster:
        name = f"{g.cluster_role_prefix}-{suffix}"
        meta = {"name": name, "labels": dict(LABELS)}
        docs += [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": meta, "rules": _rules(rule)},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": meta, "subjects": subject,
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": name}},
        ]
    return docs


def keys_secret(g: Gateway, db_base64: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(g, KEYS_SECRET), "data": {KEYS_DB: db_base64}}


def data_claim(g: Gateway) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "1Gi"}}}
    if g.storage_class:
        spec["storageClassName"] = g.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(g, DATA_CLAIM), "spec": spec}


def gateway_env(g: Gateway) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "ABX_ENGINE", "value": "kubernetes"},
        {"name": "ABX_K8S_NAMESPACE",
         "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "ABX_DATA_DIR", "value": DATA_DIR},
    ]
    for name, value in (("ABX_K8S_STORAGE_CLASS", g.storage_class),
                        ("ABX_K8S_HOSTPATH_DIR", g.hostpath_dir),
                        ("ABX_K8S_RUNTIME_CLASS", g.runtime_class),
                        ("ABX_K8S_IMAGE_PULL_POLICY", g.pull_policy)):
        if value:
            env.append({"name": name, "value": value})
    return env


CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "privileged": False,
                      "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def deployment(g: Gateway) -> dict[str, Any]:
    pull = {"imagePullPolicy": g.pull_policy} if g.pull_policy else {}
    data_mount = {"name": "data", "mountPath": DATA_DIR}
    seed = {
        "name": "seed-keys", "image": g.image, **pull,
        "command": ["sh", "-c", SEED_SCRIPT],
        "env": [{"name": "ABX_DATA_DIR", "value": DATA_DIR},
                {"name": "KEYS_SEED_FILE", "value": f"{SEED_DIR}/{KEYS_DB}"}],
        "securityContext": CONTAINER_SECURITY,
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                      "limits": {"cpu": "100m", "memory": "64Mi"}},
        "volumeMounts": [data_mount,
                         {"name": "keys-seed", "mountPath": SEED_DIR, "readOnly": True}],
    }
    # /health answers once the provider lists the namespace's sandboxes: the API server
    # and the gateway's rights work. Liveness is patient: an API hiccup is no reason to
    # restart (a restart finds every sandbox again, but drops open streams).
    health = {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 10}
    gateway = {
        "name": "gateway", "image": g.image, **pull,
        "command": ["abx", "serve", "--host", "0.0.0.0", "--port", str(PORT),
                    "--log-level", "info"],
        "env": gateway_env(g),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "readinessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**health, "initialDelaySeconds": 30, "periodSeconds": 20,
                          "failureThreshold": 6},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                      "limits": {"cpu": "2", "memory": "1Gi"}},
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [data_mount, {"name": "tmp", "mountPath": "/tmp"}],
    }
    pod = {
        "serviceAccountName": NAME,
        "automountServiceAccountToken": True,  # the gateway's only credential to the API
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                            "fsGroup": UID, "seccompProfile": {"type": "RuntimeDefault"}},
        # Open command streams get 5 s to end when it stops (surfaces/gateway/serve.py).
        "terminationGracePeriodSeconds": 15,
        "initContainers": [seed],
        "containers": [gateway],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": DATA_CLAIM}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}},
            {"name": "keys-seed", "secret": {"secretName": KEYS_SECRET,
                                             "defaultMode": 0o440}},
        ],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(g, NAME),
        # One replica: its key database is a file on a ReadWriteOnce volume, and every
        # sandbox's state is in the cluster, so a restarted gateway finds them all.
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                 "selector": {"matchLabels": {APP_LABEL: NAME}},
                 "template": {"metadata": {"labels": dict(LABELS)}, "spec": pod}},
    }


def service(g: Gateway) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(g, NAME),
            "spec": {"type": "ClusterIP", "selector": {APP_LABEL: NAME},
                     "ports": [{"name": "http", "port": PORT, "targetPort": "http",
                                "protocol": "TCP"}]}}


def sandbox_baseline_policy(g: Gateway) -> dict[str, Any]:
    """Every sandbox Pod: ingress only from the gateway to the guest port, no egress.
    NetworkPolicies add up: each sandbox's own policy (the provider's) opens what its
    network setting allows; this one is what holds before and beyond those."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(g, BASELINE_POLICY),
            "spec": {"podSelector": {"matchLabels": {LABEL_ROLE: "sandbox"}},
                     "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {APP_LABEL: NAME}}}],
                                  "ports": [{"port": GUEST_PORT, "protocol": "TCP"}]}],
                     "egress": []}}


__all__ = ["Gateway", "deployment", "namespace", "rbac", "service"]
