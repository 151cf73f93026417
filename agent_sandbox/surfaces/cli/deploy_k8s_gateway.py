"""``abx mcp deploy --target kubernetes-gateway``: the files (image, manifests, the first API
key, README) of the gateway running inside a cluster with ``ABX_ENGINE=kubernetes``.

The first key: ``abx serve`` refuses to listen beyond loopback without one, so the command
makes an admin key here, in a key database of its own; the manifests carry that database
(hashes only) in a Secret that seeds the gateway's data volume once. The key's secret is
written to ``admin-api-key`` (0600) and nowhere else.
"""

from __future__ import annotations

import base64
import json
import re
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent_sandbox.config.settings import Settings
from agent_sandbox.providers.deploy import kubernetes_gateway as m
from agent_sandbox.surfaces.cli.deploy_files import File
from agent_sandbox.surfaces.cli.yamlout import dump, dump_all

TARGET = "kubernetes-gateway"
IMAGE_BASE = "python:3.11-slim-bookworm"  # requires-python >= 3.11; no engine tools
VENV = "/opt/abx"
ADMIN_KEY_FILE = "admin-api-key"
ADMIN_KEY_NAME = "admin"
MANIFESTS = "manifests"
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?(.*)$")


@dataclass(frozen=True)
class Seed:
    """The key database the gateway starts with, and its one admin key."""

    db: bytes
    token: str
    key_id: str


def seed_keys(settings: Settings) -> Seed:
    """A fresh key database holding one admin key, made by the gateway's own KeyStore and
    copied into a single self-contained file (VACUUM INTO: no -wal beside it)."""
    from agent_sandbox.surfaces.http.keys import KeyStore

    with tempfile.TemporaryDirectory(prefix="abx-keys-") as tmp:
        path, copy = Path(tmp) / "keys.db", Path(tmp) / "seed.db"
        key, token = KeyStore(path, settings=settings).create(ADMIN_KEY_NAME, admin=True)
        conn = sqlite3.connect(str(path))
        try:
            conn.execute("VACUUM INTO ?", (str(copy),))
        finally:
            conn.close()
        return Seed(copy.read_bytes(), token, key.id)


def with_kubernetes_extra(requirement: str) -> str | None:
    """``requirement`` asking for the ``kubernetes`` extra too (a wheel file or a name);
    None when it is neither (a URL, a path to a directory)."""
    if requirement.endswith(".whl"):
        return f"{requirement}[kubernetes]"
    match = _REQUIREMENT.match(requirement)
    if not match or "/" in requirement or ":" in requirement:
        return None
    name, extras, rest = match.groups()
    wanted = [e.strip() for e in (extras or "[]")[1:-1].split(",") if e.strip()]
    if "kubernetes" not in wanted:
        wanted.append("kubernetes")
    return f"{name}[{','.join(wanted)}]{rest}"


def dockerfile(package: str, wheel: str | None, note: str) -> str:
    """The gateway's image: python slim, a venv with abx-sandbox[kubernetes], a non-root
    user. No runc or other engine tool: the sandboxes are Pods the cluster runs."""
    target = with_kubernetes_extra(f"/tmp/{wheel}" if wheel else package)
    copy = f"COPY {wheel} /tmp/{wheel}\n" if wheel else ""
    return (
        f"# agent-sandbox gateway (abx serve, REST + E2B API on port {m.PORT}) for a Kubernetes\n"
        "# cluster: ABX_ENGINE=kubernetes, sandboxes are Pods. It talks only to the API server\n"
        "# and to the sandbox Pods by IP, so it needs no engine tools and no root.\n"
        f"# Installs {note or package} with the kubernetes extra.\n"
        f"FROM {IMAGE_BASE}\n"
        f"{copy}"
        f"RUN python -m venv {VENV} \\\n"
        f"    && {VENV}/bin/pip install --no-cache-dir {json.dumps(target)} \\\n"
        "    && rm -f /tmp/*.whl \\\n"
        f"    && groupadd --system --gid {m.UID} abx \\\n"
        f"    && useradd --system --uid {m.UID} --gid {m.UID} --home-dir /home/abx "
        "--create-home \\\n"
        "       --shell /usr/sbin/nologin abx \\\n"
        f"    && install -d -o {m.UID} -g {m.UID} -m 0700 {m.DATA_DIR}\n"
        f"ENV PATH={VENV}/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \\\n"
        f"    ABX_ENGINE=kubernetes ABX_DATA_DIR={m.DATA_DIR}\n"
        f"USER {m.UID}:{m.UID}\n"
        "WORKDIR /home/abx\n"
        f"EXPOSE {m.PORT}\n"
        f'CMD ["abx", "serve", "--host", "0.0.0.0", "--port", "{m.PORT}"]\n'
    )


def manifest_files(g: m.Gateway, seed: Seed) -> list[File]:
    """Numbered so that ``kubectl apply -f manifests/`` creates them in a working order."""
    files = [File(f"{MANIFESTS}/00-namespace.yaml", dump(m.namespace(g)))] \
        if g.create_namespace else []
    secret_text = ("# The gateway's first key database (SHA-256 hashes of its keys, their names\n"
                   "# and quotas): seeds its data volume once. Keep it out of version control.\n"
                   + dump(m.keys_secret(g, base64.b64encode(seed.db).decode())))
    files += [
        File(f"{MANIFESTS}/10-rbac.yaml", dump_all(m.rbac(g))),
        File(f"{MANIFESTS}/20-keys-secret.yaml", secret_text, 0o600, secret=True),
        File(f"{MANIFESTS}/30-data-claim.yaml", dump(m.data_claim(g))),
        File(f"{MANIFESTS}/40-deployment.yaml", dump(m.deployment(g))),
        File(f"{MANIFESTS}/50-service.yaml", dump(m.service(g))),
        File(f"{MANIFESTS}/60-sandbox-networkpolicy.yaml", dump(m.sandbox_baseline_policy(g))),
    ]
    return files


def gateway_files(out: str, g: m.Gateway, seed: Seed, package: str, wheel: str | None,
                  note: str) -> list[File]:
    secrets = f"{ADMIN_KEY_FILE}\n{MANIFESTS}/20-keys-secret.yaml\n"
    return [
        File("Dockerfile", dockerfile(package, wheel, note)),
        File("README.md", readme(out, g, gateway_steps(out, g))),
        File(".dockerignore", f"{secrets}{MANIFESTS}/\nREADME.md\n.git\n"),
        File(".gitignore", f"{secrets}*.whl\n"),
        *manifest_files(g, seed),
        File(ADMIN_KEY_FILE, seed.token + "\n", 0o600, secret=True),
    ]


def gateway_steps(out: str, g: m.Gateway) -> list[str]:
    ns = f"-n {g.namespace}"
    url = f"http://{m.NAME}.{g.namespace}.svc:{m.PORT}"
    return [
        f"Build the image and push it where the nodes pull from, as {g.image} (the name in "
        f"{MANIFESTS}/40-deployment.yaml; --image changes it): cd {out} && docker build -t "
        f"{g.image} . && docker push {g.image}",
        f"Push the templates the sandboxes use into the namespace (with your own kubeconfig): "
        f"ABX_K8S_NAMESPACE={g.namespace} abx template push base --image "
        "<REGISTRY>/abx/base:<TAG> --output base.tar, then push base.tar as the command says",
        f"kubectl apply -f {out}/{MANIFESTS}/" + ("" if g.create_namespace else
                                                  f"   (namespace {g.namespace} must exist)"),
        f"kubectl {ns} rollout status deployment/{m.NAME}",
        f"Use the admin key in {out}/{ADMIN_KEY_FILE}; make a key per user or agent with "
        f"kubectl {ns} exec deploy/{m.NAME} -- abx keys create --name NAME   (prints its "
        "secret once; add --e2b for E2B SDKs)",
        f"From your machine: kubectl {ns} port-forward svc/{m.NAME} {m.PORT}:{m.PORT}, then "
        f"ABX_SANDBOX_BASE_URL=http://127.0.0.1:{m.PORT} ABX_SANDBOX_API_KEY=<key> abx "
        f"sandbox create   (in the cluster: {url})",
        f"To expose it: an Ingress or LoadBalancer in front of svc/{m.NAME} that terminates "
        "TLS (the gateway speaks plain HTTP)",
        f"MCP over HTTP in the cluster: abx mcp deploy --target kubernetes --base-url {url} "
        "--api-key <key> --generate-token -o <dir>",
    ]


def readme(out: str, g: m.Gateway, steps: list[str]) -> str:
    numbered = "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))
    hostpath = (
        f"- `{g.cluster_role_prefix}-volumes` (ClusterRole): create and delete "
        "PersistentVolumes, because `--hostpath-dir` makes each sandbox volume a hostPath "
        f"PersistentVolume under {g.hostpath_dir} (clusters without a volume provisioner), "
        "and PersistentVolumes are cluster-scoped. Such a right lets the gateway mount any "
        "directory of a node into a Pod: use it on test clusters only. The claim "
        f"`{m.DATA_CLAIM}` needs a PersistentVolume too (create one, or give a StorageClass).\n"
        if g.hostpath_dir else "")
    return f"""# agent-sandbox gateway on Kubernetes

Written by `abx mcp deploy --target {TARGET}`: the gateway (`abx serve`: REST API, E2B API)
running in namespace `{g.namespace}` with `ABX_ENGINE=kubernetes`, so it is the entry point
to the cluster: every sandbox is a Pod of this namespace.

## Next steps

{numbered}

## What is here

- `Dockerfile` and the wheel: the gateway's image ({IMAGE_BASE}, non-root user {m.UID}).
- `{MANIFESTS}/`: {"the Namespace, " if g.create_namespace else ""}the ServiceAccount and its
  rights, the key Secret, the data claim, the Deployment, the Service, the sandboxes'
  baseline NetworkPolicy.
- `{ADMIN_KEY_FILE}` (0600): the admin API key's secret. Only its hash is in the Secret.

## Rights of the gateway (`{MANIFESTS}/10-rbac.yaml`)

Exactly the calls the provider makes, nothing cluster-wide beyond listing nodes:
- `{m.NAME}` (Role, namespace `{g.namespace}` only): {m.describe(m.NAMESPACED_RULES)}, and
  the ConfigMap `{m.TEMPLATES_CONFIGMAP}` (get: the template catalog). The gateway can read
  every Secret of the namespace: give it a namespace of its own.
- `{g.cluster_role_prefix}-nodes` (ClusterRole): list nodes, so the provider replaces the
  Pods of a node that stopped answering as soon as it is NotReady.
{hostpath}
## The keys

The key database lives on the claim `{m.DATA_CLAIM}` (`{m.DATA_DIR}/{m.KEYS_DB}`), with
every key made later and who owns which volume. The Secret `{m.KEYS_SECRET}` seeds it only
while the volume has none: deploying again with new keys does not replace the keys of a
running gateway (delete the claim to start over, or manage keys with `abx keys` through
`kubectl exec`).

## Network

`{MANIFESTS}/60-sandbox-networkpolicy.yaml`: sandbox Pods (label `abx.dev/role: sandbox`)
accept connections only from the gateway (`app.kubernetes.io/name: {m.NAME}`) on the guest
port, and send nothing; each sandbox's own NetworkPolicy (made by the gateway) opens the
egress its network setting allows. NetworkPolicies are enforced only where the cluster's
network plugin enforces them (Calico, Cilium...).
"""


__all__ = ["TARGET", "Seed", "gateway_files", "gateway_steps", "readme", "seed_keys"]
