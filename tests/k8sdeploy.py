"""What the tests of ``abx mcp deploy --target kubernetes-gateway`` on the test cluster share:
the lab's kubectl, the artifact written by the real command, and removing what they applied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import k8scluster

ROOT = Path(__file__).resolve().parents[1]
# scripts/k8s/common.sh: the cluster's binaries are cached under $ABX_K8S_CACHE/bin.
KUBECTL = Path(os.environ.get("ABX_K8S_CACHE", "/var/cache/abx-k8s")) / "bin" / "kubectl"
SA_USER = "system:serviceaccount:{ns}:abx-gateway"


def missing() -> str | None:
    """Why these tests cannot run here (None: they can)."""
    reason = k8scluster.missing()
    if reason:
        return reason
    if not KUBECTL.is_file():
        return f"the test cluster's kubectl is not at {KUBECTL} (scripts/k8s_cluster.sh build)"
    return None


def kubectl(*args: str, check: bool = True, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(KUBECTL), f"--kubeconfig={k8scluster.KUBECONFIG}", *args],
                          capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


def can_i(namespace: str, verb: str, resource: str, *where: str) -> bool:
    """``kubectl auth can-i`` as the gateway's ServiceAccount of ``namespace``."""
    done = kubectl("auth", "can-i", verb, resource, *where,
                   f"--as={SA_USER.format(ns=namespace)}", check=False)
    answer = done.stdout.strip().splitlines()[-1:] or [""]
    assert answer[0] in ("yes", "no"), (verb, resource, where, done.stdout, done.stderr)
    return answer[0] == "yes"


def deploy(out: Path, home: Path, *args: str) -> dict[str, Any]:
    """The artifact, as ``abx mcp deploy --target kubernetes-gateway`` writes it (a pip
    requirement instead of the wheel: nothing here builds the image)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ABX_", "KUBECONFIG", "SANDBOX_"))}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "agent_sandbox.surfaces.cli.main", "mcp", "deploy", "--target",
         "kubernetes-gateway", "-o", str(out), "--package", "abx-sandbox==0.1.0", "--json",
         *args], env=env, capture_output=True, text=True, timeout=300, cwd=home)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def remove(out: Path, *namespaces: str) -> None:
    """Delete the cluster-scoped roles the artifact made, and ``namespaces``."""
    kubectl("delete", "--ignore-not-found", "--wait=false", "-f",
            str(out / "manifests" / "10-rbac.yaml"), check=False)
    if namespaces:
        kubectl("delete", "namespace", "--ignore-not-found", "--wait=false", *namespaces,
                check=False)
