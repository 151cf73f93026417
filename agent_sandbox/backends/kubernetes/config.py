"""Which cluster and namespace the Kubernetes provider uses, and its API client.

The kubeconfig is ``ABX_K8S_KUBECONFIG``, else ``$KUBECONFIG``, else ``~/.kube/config``;
without one, the in-cluster service account (the gateway deployed in the cluster). The
namespace is ``ABX_K8S_NAMESPACE``, else the pod's own namespace in a cluster, else
``default``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_sandbox.config.settings import Settings

_SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class ClusterConfig:
    kubeconfig: str | None  # None: in-cluster
    namespace: str
    storage_class: str
    hostpath_dir: str
    runtime_class: str
    image_pull_policy: str

    def api_client(self) -> Any:
        """A fresh ``kubernetes.client.ApiClient`` (no process-wide state is touched)."""
        from kubernetes import client, config

        if self.kubeconfig is not None:
            return config.new_client_from_config(config_file=self.kubeconfig)
        conf = client.Configuration()
        config.load_incluster_config(client_configuration=conf)
        return client.ApiClient(conf)


def _kubeconfig(settings: Settings) -> str | None:
    for candidate in (settings.k8s_kubeconfig, os.environ.get("KUBECONFIG", "")):
        if candidate:
            return candidate.split(os.pathsep)[0]
    home = Path.home() / ".kube" / "config"
    if home.is_file():
        return str(home)
    return None


def cluster_config(settings: Settings) -> ClusterConfig:
    namespace = settings.k8s_namespace
    if not namespace:
        try:
            namespace = (_SA_DIR / "namespace").read_text().strip()
        except OSError:
            namespace = "default"
    return ClusterConfig(
        kubeconfig=_kubeconfig(settings), namespace=namespace,
        storage_class=settings.k8s_storage_class, hostpath_dir=settings.k8s_hostpath_dir,
        runtime_class=settings.k8s_runtime_class,
        image_pull_policy=settings.k8s_image_pull_policy)


def cluster_problem(settings: Settings) -> str | None:
    """None when a cluster can be addressed with these settings; else what is missing
    (checked without contacting the cluster: that is the first call's job)."""
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        return ("the `kubernetes` Python client is not installed "
                "(`pip install 'agent-sandbox[kubernetes]'`)")
    path = _kubeconfig(settings)
    if path is None:
        if not (_SA_DIR / "token").is_file():
            return ("no kubeconfig (set ABX_K8S_KUBECONFIG or KUBECONFIG, or create "
                    "~/.kube/config) and not running in a cluster")
        return None
    if not os.path.isfile(path):
        return f"the kubeconfig {path} does not exist"
    return None
