"""Sandboxes as Pods of a Kubernetes cluster (``ABX_ENGINE=kubernetes``; docs/kubernetes.md)."""

from __future__ import annotations

import atexit
import threading
from typing import TYPE_CHECKING

from agent_sandbox.settings import Settings

if TYPE_CHECKING:
    from agent_sandbox.providers.kubernetes.provider import KubernetesProvider

_providers: dict[tuple[str | None, str], KubernetesProvider] = {}
_guard = threading.Lock()


def kubernetes_provider(settings: Settings | None = None) -> KubernetesProvider:
    """One provider per (kubeconfig, namespace) in this process."""
    from agent_sandbox.providers.kubernetes.config import cluster_config
    from agent_sandbox.providers.kubernetes.provider import KubernetesProvider

    config = cluster_config(settings or Settings())
    key = (config.kubeconfig, config.namespace)
    with _guard:
        provider = _providers.get(key)
        if provider is None:
            provider = _providers[key] = KubernetesProvider(config, settings or Settings())
            atexit.register(provider.close)
        return provider


__all__ = ["kubernetes_provider"]
