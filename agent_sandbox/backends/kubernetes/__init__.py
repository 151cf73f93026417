"""Sandboxes as Pods of a Kubernetes cluster (``ABX_ENGINE=kubernetes``; docs/kubernetes.md)."""
