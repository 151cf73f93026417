"""The cluster's templates: the ConfigMap ``abx-templates`` of the namespace, one key per
template, its value the template's metadata (``Template.to_json()`` less its host-side
layers) plus ``image``, the container image that holds its root filesystem and our guest
agent. ``abx template push`` writes an entry; the provider reads them."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from agent_sandbox.core.errors import NotFoundError
from agent_sandbox.core.templates import Template, validate_name

CONFIGMAP = "abx-templates"
_FRESH_FOR = 10.0  # seconds a read of the ConfigMap is reused; a miss always rereads


def entry(template: Template, image: str) -> str:
    data = template.to_json()
    data.pop("layers", None)
    data.pop("build_inputs", None)
    data["image"] = image
    return json.dumps(data, sort_keys=True)


def put(core: Any, namespace: str, template: Template, image: str) -> None:
    """Add or replace ``template``'s entry (``core``: a ``CoreV1Api``)."""
    from kubernetes.client.exceptions import ApiException

    patch = {"data": {template.name: entry(template, image)}}
    try:
        core.patch_namespaced_config_map(CONFIGMAP, namespace, patch)
    except ApiException as exc:
        if exc.status != 404:
            raise
        body = {"metadata": {"name": CONFIGMAP, "labels": {"app.kubernetes.io/managed-by":
                                                          "agent-sandbox"}}, **patch}
        core.create_namespaced_config_map(namespace, body)


class Catalog:
    """The templates of one namespace, cached briefly."""

    def __init__(self, core: Any, namespace: str) -> None:
        self.core = core
        self.namespace = namespace
        self._entries: dict[str, dict[str, Any]] = {}
        self._read_at = 0.0
        self._guard = threading.Lock()

    def _read(self) -> dict[str, dict[str, Any]]:
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self.core.read_namespaced_config_map(CONFIGMAP, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return {}
        found: dict[str, dict[str, Any]] = {}
        for name, raw in (cm.data or {}).items():
            try:
                data = json.loads(raw)
                validate_name(name)
            except Exception:  # noqa: BLE001 - a bad entry is skipped, never fatal
                continue
            if isinstance(data, dict) and isinstance(data.get("image"), str):
                found[name] = data
        return found

    def entries(self, refresh: bool = False) -> dict[str, dict[str, Any]]:
        with self._guard:
            if refresh or time.monotonic() - self._read_at > _FRESH_FOR:
                self._entries = self._read()
                self._read_at = time.monotonic()
            return dict(self._entries)

    def get(self, name: str) -> tuple[Template, str]:
        """The template named ``name`` and its image."""
        validate_name(name)
        data = self.entries().get(name) or self.entries(refresh=True).get(name)
        if data is None:
            known = ", ".join(sorted(self.entries())) or "none"
            raise NotFoundError(
                f"template {name!r} not found in the cluster (namespace {self.namespace}; "
                f"available: {known}); push it with `abx template push {name}`")
        return template_of(name, data), data["image"]


def template_of(name: str, data: dict[str, Any]) -> Template:
    return Template(
        name=name, kind="image", layers=[], env=dict(data.get("env") or {}),
        workdir=str(data.get("workdir") or "/workspace"),
        commands=dict(data.get("commands") or {}), kernel=data.get("kernel"),
        created_at=float(data.get("created_at") or 0.0),
        description=str(data.get("description") or ""),
        # A recipe's USER, CMD and ready check travel with its pushed image.
        parent=str(data.get("parent") or ""), user=str(data.get("user") or ""),
        start_cmd=str(data.get("start_cmd") or ""), ready_cmd=str(data.get("ready_cmd") or ""))
