"""The service over a Kubernetes cluster's Pods as a provider (``ABX_ENGINE=kubernetes``)."""

from __future__ import annotations

import atexit
import threading

from agent_sandbox.backends.kubernetes.backend import KubernetesBackend
from agent_sandbox.backends.kubernetes.config import cluster_config
from agent_sandbox.config.settings import Settings
from agent_sandbox.service.service import SandboxService

_providers: dict[tuple[str | None, str], SandboxService] = {}
_guard = threading.Lock()


def kubernetes_service(settings: Settings) -> SandboxService:
    """A new service over the cluster and namespace ``settings`` name."""
    backend = KubernetesBackend(cluster_config(settings), settings)
    return SandboxService(backend, backend.config)


def kubernetes_provider(settings: Settings | None = None) -> SandboxService:
    """One provider per (kubeconfig, namespace) in this process."""
    settings = settings or Settings()
    config = cluster_config(settings)
    key = (config.kubeconfig, config.namespace)
    with _guard:
        provider = _providers.get(key)
        if provider is None:
            provider = _providers[key] = kubernetes_service(settings)
            atexit.register(provider.close)
        return provider
