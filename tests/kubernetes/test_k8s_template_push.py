"""``abx template push base --load-lab`` on the test cluster: the image is on every node,
a Pod of it (no shell, no busybox: python3 only) runs to completion, and the catalog
entry names the image."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import pytest

from agent_sandbox.backends.kubernetes.catalog import Catalog

pytestmark = pytest.mark.integration


def _push_json(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "agent_sandbox.surfaces.cli", "template", "push", "base",
         "--load-lab", "--json"], env={**os.environ, **env}, capture_output=True, text=True,
        timeout=900)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_push_base_then_a_pod_runs_python_from_the_image(k8s_cluster: Any) -> None:
    # The session fixture pushed base already: this push is the same image again.
    pushed = _push_json(k8s_cluster.env)
    ref = pushed["image"]
    assert re.fullmatch(r"abx\.local/base:[0-9a-f]{12}", ref), ref
    assert pushed["loaded_lab"] and pushed["catalog_namespace"] == k8s_cluster.namespace
    assert 20e6 < pushed["size"] < 600e6  # self-contained, not the host's whole /usr

    core: Any = k8s_cluster.core()
    template, image = Catalog(core, k8s_cluster.namespace).get("base")
    assert image == ref and template.workdir == "/workspace" and template.kind == "image"

    ns, name = k8s_cluster.namespace, "push-check"
    core.create_namespaced_pod(ns, {
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                 "containers": [{"name": "c", "image": ref, "imagePullPolicy": "Never",
                                 "command": ["python3", "-c", "print('ok')"]}]}})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pod = core.read_namespaced_pod(name, ns)
            if pod.status.phase in ("Succeeded", "Failed"):
                break
            time.sleep(1)
        states = [s.state for s in pod.status.container_statuses or []]
        assert pod.status.phase == "Succeeded", (pod.status.phase, states)
        assert states[0].terminated.exit_code == 0
    finally:
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
