"""The files of ``abx mcp deploy --target kubernetes-gateway``, as pure functions: the
gateway's rights are exactly the calls the provider's code makes, its Pod runs unprivileged,
the sandboxes' baseline policy, and where the first key's secret is (and is not)."""

from __future__ import annotations

import ast
import base64
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.backends.kubernetes import objects
from agent_sandbox.config.settings import Settings
from agent_sandbox.providers.deploy import kubernetes_gateway as m
from agent_sandbox.surfaces.cli import deploy_k8s_gateway as gw
from agent_sandbox.surfaces.http.keys import KeyStore

yaml = pytest.importorskip("yaml")
ROOT = Path(__file__).resolve().parents[2]
PROVIDER = ROOT / "agent_sandbox" / "backends" / "kubernetes"
WHEEL = "abx_sandbox-9.9.9-py3-none-any.whl"
# Calls the gateway never makes: `abx template push` writes the catalog with the pusher's
# own credentials.
NOT_THE_GATEWAYS = {("catalog.py", "put")}
_API_CALL = re.compile(r"^(create|read|list|delete|patch|replace|watch|deletecollection)_"
                       r"(namespaced_)?([a-z_]+?)(_for_all_namespaces)?$")
_VERB = {"read": "get", "replace": "update"}


def _plural(snake: str) -> str:
    word = snake.replace("_", "")
    return word[:-1] + "ies" if word.endswith("y") else word + "s"


def provider_calls() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(namespaced, cluster-scoped) resource -> verbs, from every API call in the
    provider's code (``core.create_namespaced_pod`` -> pods: create)."""
    namespaced: dict[str, set[str]] = {}
    cluster: dict[str, set[str]] = {}
    apis: set[str] = set()
    for path in PROVIDER.glob("*.py"):
        tree = ast.parse(path.read_text())
        skip: set[int] = set()
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and (path.name, fn.name) in NOT_THE_GATEWAYS:
                skip |= {id(n) for n in ast.walk(fn)}
        for node in ast.walk(tree):
            # A watch (watch.Watch().stream(list_...)) needs the "watch" verb too.
            assert not (isinstance(node, ast.Attribute) and node.attr == "Watch"), path
            assert not (isinstance(node, ast.keyword) and node.arg == "watch"), path
            if id(node) in skip or not isinstance(node, ast.Attribute):
                continue
            if node.attr.endswith("Api") and isinstance(node.value, ast.Name) \
                    and node.value.id == "client":
                apis.add(node.attr)
            owner = node.value
            owner_name = owner.attr if isinstance(owner, ast.Attribute) else \
                owner.id if isinstance(owner, ast.Name) else ""
            match = _API_CALL.match(node.attr)
            if owner_name not in ("core", "net") or not match:
                continue
            verb, scoped, resource, everywhere = match.groups()
            assert not everywhere, f"{path.name}: {node.attr} reaches every namespace"
            into = namespaced if scoped else cluster
            into.setdefault(_plural(resource), set()).add(_VERB.get(verb, verb))
    # A new API group would need rules this test does not know of.
    assert apis <= {"CoreV1Api", "NetworkingV1Api", "ApiClient"}, apis
    return namespaced, cluster


def rules_of(doc: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rule in doc["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "*" not in rule["apiGroups"], rule
        for resource in rule["resources"]:
            out.setdefault(resource, set()).update(rule["verbs"])
    return out


def gateway(**kw: Any) -> m.Gateway:
    return m.Gateway(**{"namespace": "abx-gw", "image": "reg.example/abx-gateway:1", **kw})


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


@pytest.fixture(scope="module")
def seed() -> gw.Seed:
    return gw.seed_keys(Settings())


def test_the_role_is_exactly_what_the_provider_calls() -> None:
    namespaced, cluster = provider_calls()
    assert namespaced and cluster  # the scan found the calls
    for hostpath in ("", "/var/lib/abx-volumes"):
        kinds = by_kind(m.rbac(gateway(hostpath_dir=hostpath)))
        (role,) = kinds["Role"]
        assert role["metadata"]["namespace"] == "abx-gw"
        assert rules_of(role) == namespaced
        # The catalog's one ConfigMap only, by name.
        (catalog,) = [r for r in role["rules"] if r["resources"] == ["configmaps"]]
        assert catalog["resourceNames"] == [m.TEMPLATES_CONFIGMAP]
        assert all("resourceNames" not in r for r in role["rules"] if r is not catalog)
        granted: dict[str, set[str]] = {}
        for doc in kinds["ClusterRole"]:
            granted.update(rules_of(doc))
        # Cluster-wide: listing nodes; PersistentVolumes only with --hostpath-dir.
        wanted = dict(cluster) if hostpath else {
            k: v for k, v in cluster.items() if k != "persistentvolumes"}
        assert granted == wanted
        assert granted["nodes"] == {"list"}
        if hostpath:
            assert granted["persistentvolumes"] == {"create", "delete"}


def test_bindings_name_the_gateway_and_nothing_else() -> None:
    kinds = by_kind(m.rbac(gateway(hostpath_dir="/v")))
    (sa,) = kinds["ServiceAccount"]
    assert sa["metadata"] == {"name": m.NAME, "namespace": "abx-gw", "labels": m.LABELS}
    subject = [{"kind": "ServiceAccount", "name": m.NAME, "namespace": "abx-gw"}]
    (binding,) = kinds["RoleBinding"]
    assert binding["subjects"] == subject and binding["roleRef"]["kind"] == "Role"
    cluster_roles = {d["metadata"]["name"] for d in kinds["ClusterRole"]}
    assert cluster_roles == {"abx-gateway-abx-gw-nodes", "abx-gateway-abx-gw-volumes"}
    for crb in kinds["ClusterRoleBinding"]:
        assert crb["subjects"] == subject and crb["roleRef"]["name"] in cluster_roles
    # Nothing reaches an aggregated or built-in role (admin, edit, cluster-admin...).
    refs = {d["roleRef"]["name"] for d in kinds["RoleBinding"] + kinds["ClusterRoleBinding"]}
    assert refs == cluster_roles | {m.NAME}


def test_gateway_pod_runs_unprivileged_and_serves_with_keys() -> None:
    g = gateway(pull_policy="Never", hostpath_dir="/v", runtime_class="gvisor")
    dep = m.deployment(g)
    spec = dep["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == m.NAME
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == m.UID != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for forbidden in ("hostNetwork", "hostPID", "hostIPC"):
        assert forbidden not in pod
    assert all("hostPath" not in v for v in pod["volumes"])
    containers = pod["initContainers"] + pod["containers"]
    for c in containers:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert c["image"] == g.image and c["imagePullPolicy"] == "Never"
        assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    (main,) = pod["containers"]
    assert main["command"][:2] == ["abx", "serve"]
    assert main["command"][main["command"].index("--host") + 1] == "0.0.0.0"
    for probe in ("readinessProbe", "livenessProbe"):
        assert main[probe]["httpGet"] == {"path": "/health", "port": "http"}
    env = {e["name"]: e for e in main["env"]}
    assert env["ABX_ENGINE"]["value"] == "kubernetes"
    assert env["ABX_K8S_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["ABX_DATA_DIR"]["value"] == m.DATA_DIR
    assert env["ABX_K8S_HOSTPATH_DIR"]["value"] == "/v"
    assert env["ABX_K8S_RUNTIME_CLASS"]["value"] == "gvisor"
    assert env["ABX_K8S_IMAGE_PULL_POLICY"]["value"] == "Never"
    assert "ABX_K8S_KUBECONFIG" not in env  # in-cluster: its service account
    mounts = {v["mountPath"] for v in main["volumeMounts"]}
    assert mounts == {m.DATA_DIR, "/tmp"}  # all it writes
    # Defaults leave the cluster's choices alone.
    plain = m.deployment(gateway())["spec"]["template"]["spec"]["containers"][0]
    assert "imagePullPolicy" not in plain
    assert {e["name"] for e in plain["env"]} == {"ABX_ENGINE", "ABX_K8S_NAMESPACE",
                                                  "ABX_DATA_DIR"}


def test_service_and_policy_select_the_right_pods() -> None:
    g = gateway()
    pod_labels = m.deployment(g)["spec"]["template"]["metadata"]["labels"]
    svc = m.service(g)
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    policy = m.sandbox_baseline_policy(g)["spec"]
    assert policy["podSelector"] == {"matchLabels": {objects.LABEL_ROLE: "sandbox"}}
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["egress"] == []
    (ingress,) = policy["ingress"]
    assert ingress["ports"] == [{"port": objects.GUEST_PORT, "protocol": "TCP"}]
    (source,) = ingress["from"]
    assert source["podSelector"]["matchLabels"].items() <= pod_labels.items()
    # The provider's sandbox Pods carry the label the policy selects on.
    assert objects.LABEL_ROLE == "abx.dev/role"


def test_namespace_is_optional_and_baseline() -> None:
    assert m.namespace(gateway())["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "baseline"
    seed = gw.Seed(b"db", "abx_" + "t" * 40, "key-1")
    names = [f.path for f in gw.manifest_files(gateway(create_namespace=False), seed)]
    assert not any("namespace" in n for n in names)
    assert sorted(names) == names  # kubectl apply -f DIR goes in name order


def test_secrets_only_in_the_0600_files(seed: gw.Seed) -> None:
    files = gw.gateway_files("/out", gateway(), seed, WHEEL, WHEEL, "a note")
    db64 = base64.b64encode(seed.db).decode()
    hashed = hashlib.sha256(seed.token.encode()).hexdigest()
    secret_files = {f.path for f in files if f.secret}
    assert secret_files == {gw.ADMIN_KEY_FILE, "manifests/20-keys-secret.yaml"}
    for f in files:
        assert (f.mode == 0o600) == f.secret, f.path
        if f.path != gw.ADMIN_KEY_FILE:
            assert seed.token not in f.text and seed.token[4:20] not in f.text, f.path
        if f.path != "manifests/20-keys-secret.yaml":
            assert db64[:40] not in f.text and hashed not in f.text, f.path
    text = {f.path: f.text for f in files}
    assert text[gw.ADMIN_KEY_FILE] == seed.token + "\n"
    ignored = text[".gitignore"].split() + text[".dockerignore"].split()
    assert secret_files <= set(ignored)
    assert WHEEL not in text[".dockerignore"] and "*.whl" not in text[".dockerignore"]


def test_the_seed_is_a_key_database_that_knows_the_admin_key(
        seed: gw.Seed, tmp_path: Path) -> None:
    doc = yaml.safe_load("".join(
        f.text for f in gw.manifest_files(gateway(), seed)
        if f.path.endswith("keys-secret.yaml")))
    db = tmp_path / "keys.db"
    db.write_bytes(base64.b64decode(doc["data"][m.KEYS_DB]))
    store = KeyStore(db)
    key = store.authenticate(seed.token)
    assert key is not None and key.admin and key.id == seed.key_id
    assert [k.name for k in store.list()] == [gw.ADMIN_KEY_NAME]
    assert store.authenticate(seed.token + "x") is None


def test_the_seed_script_fills_an_empty_volume_once(seed: gw.Seed, tmp_path: Path) -> None:
    sh = shutil.which("sh")
    if sh is None:
        pytest.skip("no sh")
    (init,) = m.deployment(gateway())["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:2] == ["sh", "-c"]
    source = tmp_path / "seed" / m.KEYS_DB
    source.parent.mkdir()
    source.write_bytes(seed.db)
    data = tmp_path / "data"
    data.mkdir()
    env = {"PATH": os.environ["PATH"], "ABX_DATA_DIR": str(data),
           "KEYS_SEED_FILE": str(source)}
    first = subprocess.run(init["command"], env=env, capture_output=True, text=True,
                           timeout=30)
    assert first.returncode == 0 and "seeded" in first.stdout, first
    db = data / m.KEYS_DB
    assert db.read_bytes() == seed.db and stat.S_IMODE(db.stat().st_mode) == 0o600
    assert sorted(p.name for p in data.iterdir()) == [m.KEYS_DB]
    db.write_bytes(b"the gateway's own, with later keys")
    again = subprocess.run(init["command"], env=env, capture_output=True, text=True,
                           timeout=30)
    assert again.returncode == 0 and "not used" in again.stdout
    assert db.read_bytes() == b"the gateway's own, with later keys"


def test_dockerfile_installs_the_kubernetes_extra_and_no_engine() -> None:
    text = gw.dockerfile(WHEEL, WHEEL, "the note")
    assert text.splitlines()[4] == f"FROM {gw.IMAGE_BASE}" and "slim" in gw.IMAGE_BASE
    assert f"COPY {WHEEL} /tmp/{WHEEL}" in text
    assert f'pip install --no-cache-dir "/tmp/{WHEEL}[kubernetes]"' in text
    assert f"USER {m.UID}:{m.UID}" in text and m.UID != 0
    for tool in ("runc", "nftables", "e2fsprogs", "apt-get", "privileged"):
        assert tool not in text, tool
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(r.startswith("kubernetes") for r in extras["kubernetes"])
    by_name = gw.dockerfile("abx-sandbox==9.9.9", None, "")
    assert '"abx-sandbox[kubernetes]==9.9.9"' in by_name and "COPY" not in by_name


@pytest.mark.parametrize(("given", "wanted"), [
    ("abx-sandbox", "abx-sandbox[kubernetes]"),
    ("abx-sandbox==1.2", "abx-sandbox[kubernetes]==1.2"),
    ("abx-sandbox[test]>=1", "abx-sandbox[test,kubernetes]>=1"),
    ("abx-sandbox[kubernetes]", "abx-sandbox[kubernetes]"),
    ("/w/x.whl", "/w/x.whl[kubernetes]"),
    ("git+https://example.com/abx.git", None),
    ("./src", None),
])
def test_kubernetes_extra_added(given: str, wanted: str | None) -> None:
    assert gw.with_kubernetes_extra(given) == wanted


def test_readme_says_what_to_do_and_why_the_rights(seed: gw.Seed) -> None:
    g = gateway(hostpath_dir="/var/lib/v")
    text = gw.readme("/out", g, gw.gateway_steps("/out", g))
    for needed in ("docker build -t reg.example/abx-gateway:1", "kubectl apply -f /out/manifests/",
                   "abx keys create", "port-forward svc/abx-gateway", "abx template push",
                   "abx-gateway-abx-gw-volumes", "PersistentVolumes", "nodes"):
        assert needed in text, needed
    plain = gw.readme("/out", gateway(), gw.gateway_steps("/out", gateway()))
    assert "-volumes" not in plain
