"""The test cluster (``scripts/k8s_cluster.sh``) as the Kubernetes tests use it: one
namespace per test session with the ``base`` template pushed into it, and the settings
that point the provider at it. Everything is removed at the end of the session.

The cluster is started by the README's test command (``scripts/setup.sh test``); when it
is not running here, the tests that need it skip saying why (the reason setup wrote, if
its build or start failed).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

KUBECONFIG = Path(os.environ.get("ABX_K8S_STATE", "/var/lib/abx-k8s")) / "kubeconfig"
# Why setup could not start the cluster (written by scripts/setup.sh test).
SETUP_NOTE = Path(os.environ.get("ABX_K8S_STATE", "/var/lib/abx-k8s")) / "setup-skip-reason"
VOLUMES = "/var/lib/abx-k8s-test-volumes"


@dataclass
class TestCluster:
    namespace: str
    env: dict[str, str]
    _pusher: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1))
    _pushes: dict[str, Future[None]] = field(default_factory=dict)

    def push_soon(self, template: str) -> None:
        """Start pushing ``template`` in the background (the other Kubernetes tests run
        meanwhile: a big image takes minutes to import into every node)."""
        if template not in self._pushes:
            self._pushes[template] = self._pusher.submit(push, template, self.env)

    def pushed(self, template: str) -> None:
        """``template`` in the namespace, its push started now if not before."""
        self.push_soon(template)
        self._pushes[template].result()

    def core(self) -> object:
        from kubernetes import client, config

        return client.CoreV1Api(config.new_client_from_config(config_file=str(KUBECONFIG)))


def missing() -> str | None:
    """None when the test cluster answers; else why the Kubernetes tests skip."""
    if os.geteuid() != 0:
        return "the test cluster needs root"
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        return "the kubernetes Python client is not installed (pip install '.[test]')"
    if not KUBECONFIG.is_file():
        note = SETUP_NOTE.read_text().strip() if SETUP_NOTE.is_file() else ""
        return note or ("the test cluster is not running (scripts/k8s_cluster.sh build && "
                        "scripts/k8s_cluster.sh up)")
    status = subprocess.run(["bash", "scripts/k8s_cluster.sh", "status"], capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parents[1])
    if status.returncode != 0:
        return f"the test cluster is not up: {status.stdout.strip().splitlines()[-1:]}"
    return None


def settings_env(namespace: str) -> dict[str, str]:
    return {"ABX_ENGINE": "kubernetes", "ABX_K8S_KUBECONFIG": str(KUBECONFIG),
            "ABX_K8S_NAMESPACE": namespace, "ABX_K8S_HOSTPATH_DIR": f"{VOLUMES}/{namespace}",
            "ABX_K8S_IMAGE_PULL_POLICY": "Never"}


def push(template: str, env: dict[str, str]) -> None:
    """``abx template push TEMPLATE --load-lab`` into the session's namespace."""
    done = subprocess.run(
        [sys.executable, "-m", "agent_sandbox.surfaces.cli.main", "template", "push", template,
         "--load-lab"], env={**os.environ, **env}, capture_output=True, text=True,
        timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"abx template push {template} failed:\n{done.stdout}\n"
                           f"{done.stderr}")


@contextmanager
def session_namespace() -> Iterator[TestCluster]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    namespace = f"abx-test-{secrets.token_hex(3)}"
    cluster = TestCluster(namespace, settings_env(namespace))
    core = cluster.core()
    core.create_namespace({"metadata": {"name": namespace}})  # type: ignore[attr-defined]
    try:
        push("base", cluster.env)
        code = code_interpreter_built()
        if code:
            cluster.push_soon(code)
        yield cluster
    finally:
        cluster._pusher.shutdown(cancel_futures=True)
        _drop_provider(cluster.env)
        core.delete_namespace(namespace, body=client.V1DeleteOptions(  # type: ignore[attr-defined]
            grace_period_seconds=0, propagation_policy="Background"))
        for pv in core.list_persistent_volume().items:  # type: ignore[attr-defined]
            ref = pv.spec.claim_ref
            if ref is not None and ref.namespace == namespace:
                with contextlib.suppress(ApiException):  # already deleted by its test
                    core.delete_persistent_volume(pv.metadata.name)  # type: ignore[attr-defined]
        shutil.rmtree(f"{VOLUMES}/{namespace}", ignore_errors=True)


def code_interpreter_built() -> str | None:
    """code-interpreter-v1's name if setup built it (then its image is pushed early)."""
    from agent_sandbox.backends.runc.templates import code_interpreter
    from agent_sandbox.config.settings import Settings

    built = Settings().shared_templates_dir / code_interpreter.NAME / "template.json"
    return code_interpreter.NAME if built.is_file() else None


def _drop_provider(env: dict[str, str]) -> None:
    """Stop this process's provider of the namespace (its supervisor refills pools)."""
    from agent_sandbox.providers import kubernetes as k8s

    for key, provider in list(k8s._providers.items()):
        if key[1] == env["ABX_K8S_NAMESPACE"]:
            provider.close()
            k8s._providers.pop(key, None)
