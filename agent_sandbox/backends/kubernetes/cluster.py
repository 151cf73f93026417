"""The API calls the provider makes, each bounded in time, answering plain dicts.

Reads ask for raw JSON (``_preload_content=False``): the client's model classes cost more
to build than the call takes, and dicts are what the provider reads anyway. An error of
the API server becomes our error with the server's own message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from agent_sandbox.backends.kubernetes.config import ClusterConfig
from agent_sandbox.core.errors import NotFoundError, RuntimeUnavailableError, SandboxError

_TIMEOUT = (5, 30)  # connect, read (seconds) of every call
_MAX_BODY = 64 << 20  # a list of a namespace's objects, at most


class Conflict(SandboxError):
    """The object changed since it was read (its resourceVersion): read it again."""


def _message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "reason", exc))


class Cluster:
    """One namespace of one cluster."""

    def __init__(self, config: ClusterConfig) -> None:
        from kubernetes import client

        self.config = config
        self.namespace = config.namespace
        self.api = config.api_client()
        self.core = client.CoreV1Api(self.api)
        self.net = client.NetworkingV1Api(self.api)

    def close(self) -> None:
        self.api.close()

    def _call(self, fn: Callable[..., Any], *args: Any, raw: bool = False, **kw: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            if raw:
                resp = fn(*args, _request_timeout=_TIMEOUT, _preload_content=False, **kw)
                body = resp.read(_MAX_BODY + 1)
                if len(body) > _MAX_BODY:
                    raise RuntimeUnavailableError("the Kubernetes API answered over 64 MiB")
                return json.loads(body)
            return fn(*args, _request_timeout=_TIMEOUT, **kw)
        except ApiException as exc:
            if exc.status == 404:
                raise NotFoundError(_message(exc)) from None
            if exc.status == 409:
                raise Conflict(_message(exc)) from None
            raise RuntimeUnavailableError(
                f"the Kubernetes API refused the call ({exc.status}): {_message(exc)}"
            ) from None
        except (HTTPError, OSError) as exc:
            raise RuntimeUnavailableError(f"cannot reach the Kubernetes API: {exc}") from None

    # objects by kind --------------------------------------------------------------------
    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        kind, ns = manifest["kind"], self.namespace
        fn = {"Pod": self.core.create_namespaced_pod,
              "Secret": self.core.create_namespaced_secret,
              "PersistentVolumeClaim": self.core.create_namespaced_persistent_volume_claim,
              "NetworkPolicy": self.net.create_namespaced_network_policy}.get(kind)
        if kind == "PersistentVolume":
            return self._call(self.core.create_persistent_volume, manifest, raw=True)
        assert fn is not None, kind
        return self._call(fn, ns, manifest, raw=True)

    def delete(self, kind: str, name: str) -> None:
        """Delete now (no grace period); an object already gone is not an error."""
        from kubernetes import client

        opts = client.V1DeleteOptions(grace_period_seconds=0, propagation_policy="Background")
        ns = self.namespace
        try:
            if kind == "PersistentVolume":
                self._call(self.core.delete_persistent_volume, name, body=opts)
                return
            fn = {"Pod": self.core.delete_namespaced_pod,
                  "Secret": self.core.delete_namespaced_secret,
                  "PersistentVolumeClaim": self.core.delete_namespaced_persistent_volume_claim,
                  "NetworkPolicy": self.net.delete_namespaced_network_policy}[kind]
            self._call(fn, name, ns, body=opts)
        except NotFoundError:
            pass

    def get(self, kind: str, name: str) -> dict[str, Any]:
        ns = self.namespace
        fn = {"Pod": self.core.read_namespaced_pod,
              "Secret": self.core.read_namespaced_secret,
              "PersistentVolumeClaim": self.core.read_namespaced_persistent_volume_claim}[kind]
        return self._call(fn, name, ns, raw=True)

    def patch(self, kind: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A merge patch; with ``metadata.resourceVersion`` in ``body`` it applies only if
        the object is still that version (else ``Conflict``)."""
        ns = self.namespace
        fn = {"Pod": self.core.patch_namespaced_pod,
              "Secret": self.core.patch_namespaced_secret,
              "PersistentVolumeClaim": self.core.patch_namespaced_persistent_volume_claim,
              }[kind]
        return self._call(fn, name, ns, body, raw=True)

    def replace_network_policy(self, manifest: dict[str, Any]) -> None:
        """Replaced in one write: never a moment with no policy (delete then create
        would leave the Pod unrestricted in between)."""
        name = manifest["metadata"]["name"]
        try:
            self._call(self.net.replace_namespaced_network_policy, name, self.namespace,
                       manifest, raw=True)
        except NotFoundError:
            self.create(manifest)

    def list(self, kind: str, selector: str) -> list[dict[str, Any]]:
        ns = self.namespace
        fn = {"Pod": self.core.list_namespaced_pod,
              "Secret": self.core.list_namespaced_secret,
              "PersistentVolumeClaim": self.core.list_namespaced_persistent_volume_claim,
              }[kind]
        return list(self._call(fn, ns, label_selector=selector, raw=True).get("items") or [])

    def nodes(self) -> list[dict[str, Any]]:
        return list(self._call(self.core.list_node, raw=True).get("items") or [])

    # pods -------------------------------------------------------------------------------
    def wait_running(self, name: str, timeout: float) -> dict[str, Any]:
        """The Pod once its container runs and it has an address. A Pod that fails,
        cannot pull its image or is deleted meanwhile is an error saying why."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            pod = self.get("Pod", name)
            problem = pod_problem(pod)
            if problem:
                raise RuntimeUnavailableError(f"sandbox pod {name} cannot start: {problem}")
            status = pod.get("status") or {}
            running = any("running" in (c.get("state") or {})
                          for c in status.get("containerStatuses") or [])
            if running and status.get("podIP"):
                return pod
            if time.monotonic() >= deadline:
                raise RuntimeUnavailableError(
                    f"sandbox pod {name} did not start within {timeout:.0f} s "
                    f"(phase {status.get('phase', '?')}): see `kubectl describe pod {name}`")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)


_WAITING_FATAL = ("ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull",
                  "InvalidImageName", "CreateContainerError", "RunContainerError")


def pod_problem(pod: dict[str, Any]) -> str | None:
    """Why this Pod will not run (None: it runs or may still)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "it is being deleted"
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"it ended ({status.get('phase')}: {status.get('reason') or 'no reason'})"
    for c in status.get("containerStatuses") or []:
        state = c.get("state") or {}
        waiting = state.get("waiting") or {}
        # A kubelet whose secret cache lags says CreateContainerConfigError, then retries:
        # only a missing object is final.
        config_gone = (waiting.get("reason") == "CreateContainerConfigError"
                       and "not found" in str(waiting.get("message")))
        if waiting.get("reason") in _WAITING_FATAL or config_gone:
            return f"{waiting['reason']}: {str(waiting.get('message') or '')[:300]}"
        if "terminated" in state:
            term = state["terminated"]
            return f"its guest exited ({term.get('reason')}, code {term.get('exitCode')})"
    return None


def timestamp(value: str | None) -> float:
    """An API timestamp (RFC 3339) as epoch seconds; 0 if it is not one."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
