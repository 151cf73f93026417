"""What ``abx mcp deploy`` writes for a backend this process does not run: the manifests of
the gateway inside a cluster (the Kubernetes backend's knowledge of what its Pods need)."""

from agent_sandbox.backends.kubernetes import manifests as kubernetes_gateway

__all__ = ["kubernetes_gateway"]
