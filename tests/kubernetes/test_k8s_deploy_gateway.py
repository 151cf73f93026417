"""The gateway as the kubernetes-gateway artifact runs it, with nothing more: the Deployment's
command and environment, the init container's seed of the key database, the image's
unprivileged user, and the ServiceAccount's token with the RBAC the artifact grants.

The lab has no registry and no kube-proxy (a Pod could not reach the API server through
its Service), so the gateway runs on the host as a process: same command, same user id,
same rights, a kubeconfig holding the ServiceAccount's token. A sandbox made through it
with the seeded admin key proves those rights are enough."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import k8scluster
import k8sdeploy
import pytest
import yaml

from agent_sandbox.providers.deploy import kubernetes_gateway as m
from agent_sandbox.remote import RemoteProvider
from agent_sandbox.surfaces.gateway.process import free_port

pytestmark = pytest.mark.integration


def _token(namespace: str) -> tuple[str, str]:
    """The gateway ServiceAccount's token and the cluster CA (the token controller makes
    the Secret moments after the account)."""
    deadline = time.monotonic() + 60
    while True:
        names = k8sdeploy.kubectl("get", "serviceaccount", m.NAME, "-n", namespace, "-o",
                                  "jsonpath={.secrets[*].name}").stdout.split()
        if names:
            secret = yaml.safe_load(k8sdeploy.kubectl(
                "get", "secret", names[0], "-n", namespace, "-o", "yaml").stdout)
            data = secret.get("data") or {}
            if data.get("token"):
                return base64.b64decode(data["token"]).decode(), data["ca.crt"]
        assert time.monotonic() < deadline, "no token Secret for the gateway's account"
        time.sleep(0.5)


def _kubeconfig(path: Path, namespace: str) -> None:
    admin = yaml.safe_load(k8scluster.KUBECONFIG.read_text())
    token, ca = _token(namespace)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gw",
        "clusters": [{"name": "lab", "cluster": {
            "server": admin["clusters"][0]["cluster"]["server"],
            "certificate-authority-data": ca}}],
        "users": [{"name": "gw", "user": {"token": token}}],
        "contexts": [{"name": "gw", "context": {"cluster": "lab", "user": "gw",
                                                 "namespace": namespace}}]}))
    path.chmod(0o600)


def _as_gateway_user(argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={m.UID}", f"--regid={m.UID}", "--clear-groups", "--", *argv]


def _env(container: dict[str, Any], namespace: str, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    for e in container["env"]:
        if "valueFrom" in e:  # the downward API: the Pod's namespace
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}, e
            env[e["name"]] = namespace
        else:
            env[e["name"]] = e["value"]
    return env


def test_gateway_serves_with_only_its_rights_as_non_root(k8s_cluster: Any) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv (util-linux) to run the gateway as its image's user")
    ns = k8s_cluster.namespace
    work = Path(tempfile.mkdtemp(prefix="abx-deploy-gw-"))
    out = work / "artifact"
    k8sdeploy.deploy(out, work / "cli-home", "--namespace", ns, "--no-create-namespace",
                     "--hostpath-dir", k8s_cluster.env["ABX_K8S_HOSTPATH_DIR"],
                     "--image-pull-policy", "Never")
    manifests = out / "manifests"
    proc: subprocess.Popen[bytes] | None = None
    log_path = Path(tempfile.mkdtemp(prefix="abx-deploy-gw-log-")) / "gateway.log"
    try:
        k8sdeploy.kubectl("apply", "-f", str(manifests / "10-rbac.yaml"))
        k8sdeploy.kubectl("apply", "--dry-run=server", "-f", str(manifests))
        # What the Pod would have: a home it cannot write (its root filesystem is
        # read-only; root owns this one), the data volume, the seed Secret, the account's
        # credentials. Beyond these, user 10001 can write only /tmp, an emptyDir there.
        home, data, seed_dir, sa = (work / "home", work / "data", work / "seed",
                                    work / "serviceaccount")
        for d in (home, data, seed_dir, sa):
            d.mkdir(mode=0o755)
        secret = yaml.safe_load((manifests / "20-keys-secret.yaml").read_text())
        (seed_dir / m.KEYS_DB).write_bytes(base64.b64decode(secret["data"][m.KEYS_DB]))
        kubeconfig = sa / "kubeconfig"
        _kubeconfig(kubeconfig, ns)
        for path in (work, data, seed_dir, sa, kubeconfig):
            os.chown(path, m.UID, m.UID)
        pod = yaml.safe_load((manifests / "40-deployment.yaml").read_text())[
            "spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == m.UID
        base = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
                "PYTHONPATH": str(k8sdeploy.ROOT), "PYTHONDONTWRITEBYTECODE": "1"}

        (init,) = pod["initContainers"]
        init_env = _env(init, ns, base)
        init_env.update(ABX_DATA_DIR=str(data), KEYS_SEED_FILE=str(seed_dir / m.KEYS_DB))
        seeded = subprocess.run(_as_gateway_user(init["command"]), env=init_env,
                                capture_output=True, text=True, timeout=60)
        assert seeded.returncode == 0 and "seeded" in seeded.stdout, seeded

        (container,) = pod["containers"]
        command = list(container["command"])
        assert command[:2] == ["abx", "serve"]
        port = free_port()
        # Loopback here (the Pod listens on 0.0.0.0, which the seeded key allows).
        command[command.index("--host") + 1] = "127.0.0.1"
        command[command.index("--port") + 1] = str(port)
        env = _env(container, ns, base)
        env.update(ABX_DATA_DIR=str(data), ABX_K8S_KUBECONFIG=str(kubeconfig))
        with open(log_path, "wb") as log_file:  # a file: a full pipe would stall it
            proc = subprocess.Popen(
                _as_gateway_user([sys.executable, "-m", "agent_sandbox.surfaces.cli.main",
                                  *command[1:]]),
                env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                cwd=str(home))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the gateway did not answer /health"
            time.sleep(0.3)

        assert httpx.get(url + "/v1/sandboxes", timeout=10).status_code == 401
        token = (out / "admin-api-key").read_text().strip()
        client = RemoteProvider(url, token, retry_seconds=5)
        info = client.create(template="base")
        try:
            assert client.run(info.sandbox_id, "echo hi").stdout == "hi\n"
            client.write_file(info.sandbox_id, "/workspace/f.txt", b"kept")
            assert b"".join(client.read_file(info.sandbox_id, "/workspace/f.txt")) == b"kept"
        finally:
            client.kill(info.sandbox_id, delete_volume=True)
        # A key made in the running gateway's data dir, as `kubectl exec ... abx keys
        # create` does in the Pod, works at once.
        made = subprocess.run(
            _as_gateway_user([sys.executable, "-m", "agent_sandbox.surfaces.cli.main", "keys",
                              "create", "--name", "alice"]),
            env=env, capture_output=True, text=True, timeout=60, cwd=str(home))
        assert made.returncode == 0, made.stderr
        alice = RemoteProvider(url, made.stdout.strip(), retry_seconds=5)
        assert alice.list() == []
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        k8sdeploy.kubectl("delete", "--ignore-not-found", "--wait=false", "-f",
                          str(manifests / "10-rbac.yaml"), check=False)
        shutil.rmtree(work, ignore_errors=True)
    log = log_path.read_text(errors="replace")
    shutil.rmtree(log_path.parent, ignore_errors=True)
    # Every call it made was allowed (the supervisor's passes included).
    for sign in ("403", "forbidden", "supervisor pass failed", "Traceback"):
        assert sign not in log, log
