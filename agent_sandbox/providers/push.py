"""A local template as a container image for a cluster (``abx template push``): this
host's template store (the runc backend's) exports its self-contained layers, the
Kubernetes backend writes the image and the catalog entry that names it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_sandbox.backends.kubernetes import catalog, images
from agent_sandbox.backends.kubernetes.config import cluster_config, cluster_problem
from agent_sandbox.backends.runc.templates.code_interpreter import store_for
from agent_sandbox.backends.runc.templates.export import exported
from agent_sandbox.config.engine import EngineConfig
from agent_sandbox.config.settings import Settings
from agent_sandbox.core.errors import RuntimeUnavailableError

REGISTRY = images.REGISTRY
ImageBuild = images.ImageBuild
check_ref = images.check_ref


class Catalog:
    """The cluster's template catalog, reached (and checked) before a long build."""

    def __init__(self, settings: Settings) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        problem = cluster_problem(settings)
        if problem:
            raise RuntimeUnavailableError(
                f"cannot write the cluster's template catalog: {problem} (or pass "
                "--no-catalog to only build the image)")
        config = cluster_config(settings)
        self.namespace, self.kubeconfig = config.namespace, config.kubeconfig
        self.core = client.CoreV1Api(config.api_client())

        def check() -> None:
            try:
                self.core.read_namespace(config.namespace)
            except ApiException as exc:
                if exc.status != 403:  # a namespaced account may not read namespaces
                    raise
            self.core.list_namespaced_config_map(config.namespace, limit=1)

        self._call(check)

    def _call(self, call: Callable[[], Any]) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        where = (f"namespace {self.namespace} "
                 f"({'kubeconfig ' + self.kubeconfig if self.kubeconfig else 'in-cluster'})")
        try:
            return call()
        except ApiException as exc:
            hint = {404: "does the namespace exist? (ABX_K8S_NAMESPACE)",
                    403: "the account may not read and write ConfigMaps there",
                    401: "the kubeconfig's credentials were refused"}.get(exc.status, "")
            raise RuntimeUnavailableError(
                f"the cluster refused a template catalog call in {where}: {exc.status} "
                f"{exc.reason}{'; ' + hint if hint else ''}") from None
        except (HTTPError, OSError) as exc:
            raise RuntimeUnavailableError(f"cannot reach the cluster for {where}: {exc}"
                                          ) from None

    def put(self, settings: Settings, name: str, ref: str) -> None:
        """Record template ``name`` (this host's) as the image ``ref``."""
        template = store_for(EngineConfig.from_settings(settings)).get(name)
        self._call(lambda: catalog.put(self.core, self.namespace, template, ref))


def build_image(settings: Settings, name: str, out: Path, *, ref: str | None = None,
                progress: images.Progress | None = None) -> images.ImageBuild:
    """Write the image of this host's template ``name`` to ``out``."""
    started = time.monotonic()
    if ref is not None:
        images.check_ref(ref)
    config = EngineConfig.from_settings(settings)
    if progress:
        progress("preparing the self-contained base", 0, 0)
    template, layers = exported(store_for(config), name, config.data_dir)
    return images.write_image(template, layers, out, ref=ref, progress=progress,
                              started=started)


def scratch_path(settings: Settings, name: str) -> Path:
    """Where an image goes when the caller keeps no file of it."""
    return (EngineConfig.from_settings(settings).data_dir / "k8s-images"
            / f".push-{name}-{time.time_ns():x}.tar")
