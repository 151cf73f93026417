"""The kubernetes-gateway artifact against the test cluster's API server: every manifest is
accepted (``kubectl apply --dry-run=server``), and the gateway's ServiceAccount, with the
RBAC applied for real, may do what the provider does in its namespace and nothing
elsewhere (``kubectl auth can-i --as``)."""

from __future__ import annotations

import secrets
from pathlib import Path

import k8sdeploy
import pytest

pytestmark = pytest.mark.integration

# What the provider does in its own namespace (backends/kubernetes/cluster.py).
ALLOWED = [(verb, resource) for resource in ("pods", "secrets", "persistentvolumeclaims")
           for verb in ("create", "get", "list", "patch", "delete")] + [
    ("create", "networkpolicies.networking.k8s.io"),
    ("update", "networkpolicies.networking.k8s.io"),
    ("delete", "networkpolicies.networking.k8s.io"),
    ("get", "configmaps/abx-templates"),
]
# In its own namespace still, what it must not do.
DENIED_HERE = [("create", "configmaps"), ("patch", "configmaps/abx-templates"),
               ("list", "configmaps"), ("get", "configmaps/other"),
               ("update", "pods"), ("watch", "pods"), ("deletecollection", "pods"),
               ("create", "roles.rbac.authorization.k8s.io"),
               ("create", "rolebindings.rbac.authorization.k8s.io"),
               ("create", "serviceaccounts"), ("create", "deployments.apps"),
               ("create", "services"), ("impersonate", "serviceaccounts")]
SUBRESOURCES = ["exec", "attach", "portforward", "log"]


@pytest.fixture(scope="module")
def reachable() -> None:
    reason = k8sdeploy.missing()
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("hostpath", [False, True], ids=["default", "hostpath"])
def test_manifests_apply_and_rights_stay_in_the_namespace(
        reachable: None, tmp_path: Path, hostpath: bool) -> None:
    tag = secrets.token_hex(3)
    ns, other = f"abx-deploy-{tag}", f"abx-deploy-other-{tag}"
    out = tmp_path / "gw"
    extra = ["--hostpath-dir", f"/var/lib/abx-deploy-test/{tag}"] if hostpath else []
    info = k8sdeploy.deploy(out, tmp_path / "home", "--namespace", ns,
                            "--image-pull-policy", "Never", *extra)
    manifests = out / "manifests"
    try:
        k8sdeploy.kubectl("create", "namespace", other)
        # The namespace and the rights for real (can-i reads real bindings); then
        # everything, the Deployment included, checked by the API server without a trace.
        k8sdeploy.kubectl("apply", "-f", str(manifests / "00-namespace.yaml"),
                          "-f", str(manifests / "10-rbac.yaml"))
        dry = k8sdeploy.kubectl("apply", "--dry-run=server", "-f", str(manifests)).stdout
        for kind in ("secret/abx-gateway-keys", "persistentvolumeclaim/abx-gateway-data",
                     "deployment.apps/abx-gateway", "service/abx-gateway",
                     "networkpolicy.networking.k8s.io/abx-sandbox-baseline"):
            assert f"{kind} created (server dry run)" in dry, dry
        left = k8sdeploy.kubectl("get", "deployments,services,secrets,pvc,networkpolicies",
                                 "-n", ns, "-o", "name").stdout.split()
        assert not [n for n in left if "-token-" not in n], left  # the SA's own token only

        for verb, resource in ALLOWED:
            assert k8sdeploy.can_i(ns, verb, resource, "-n", ns), (verb, resource)
            for elsewhere in (other, "kube-system"):
                assert not k8sdeploy.can_i(ns, verb, resource, "-n", elsewhere), (
                    verb, resource, elsewhere)
        for verb, resource in DENIED_HERE:
            assert not k8sdeploy.can_i(ns, verb, resource, "-n", ns), (verb, resource)
        for sub in SUBRESOURCES:  # never into a sandbox by the API: by the guest channel
            assert not k8sdeploy.can_i(ns, "create", "pods", f"--subresource={sub}", "-n", ns)
            assert not k8sdeploy.can_i(ns, "get", "pods", f"--subresource={sub}", "-n", ns)
        for verb in ("get", "list", "watch"):
            assert not k8sdeploy.can_i(ns, verb, "secrets", "--all-namespaces")
        # Cluster-wide: listing nodes, and PersistentVolumes only with --hostpath-dir.
        assert k8sdeploy.can_i(ns, "list", "nodes")
        for verb in ("get", "watch", "patch", "delete"):
            assert not k8sdeploy.can_i(ns, verb, "nodes"), verb
        for verb in ("create", "delete"):
            assert k8sdeploy.can_i(ns, verb, "persistentvolumes") is hostpath, verb
        for verb in ("get", "list", "patch"):
            assert not k8sdeploy.can_i(ns, verb, "persistentvolumes"), verb
        for verb, resource in (("create", "namespaces"), ("delete", "namespaces"),
                               ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
                               ("escalate", "clusterroles.rbac.authorization.k8s.io"),
                               ("impersonate", "users"), ("*", "*")):
            assert not k8sdeploy.can_i(ns, verb, resource), (verb, resource)
        assert len(info["cluster_roles"]) == (2 if hostpath else 1)
    finally:
        k8sdeploy.remove(out, ns, other)
