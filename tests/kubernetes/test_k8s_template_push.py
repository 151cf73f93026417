"""``abx template push base --load-lab`` on the test cluster: the image is on every node,
a Pod of it (no shell, no busybox: python3 only) runs to completion, and the catalog
entry names the image. A template built from a recipe pushes too: a sandbox of the
Kubernetes provider has its files, environment, user and working directory."""

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


def _push_json(env: dict[str, str], template: str = "base") -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "agent_sandbox.surfaces.cli", "template", "push", template,
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


def test_push_a_recipe_template_and_a_sandbox_runs_it(k8s_cluster: Any) -> None:
    from agent_sandbox import Sandbox
    from agent_sandbox.providers.local import local_provider

    local_provider().build_recipe(
        "k8s-recipe", "FROM base\nENV RECIPE=pushed\nWORKDIR /opt/k8s\n"
        "RUN echo from-recipe > made && chown user made\nUSER user\n", network="off")
    pushed = _push_json(k8s_cluster.env, "k8s-recipe")
    assert re.fullmatch(r"abx\.local/k8s-recipe:[0-9a-f]{12}", pushed["image"]), pushed
    template, image = Catalog(k8s_cluster.core(), k8s_cluster.namespace).get("k8s-recipe")
    assert image == pushed["image"]
    assert (template.user, template.workdir, template.parent) == ("user", "/opt/k8s", "base")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in k8s_cluster.env.items():
            mp.setenv(name, value)
        sb = Sandbox.create(template="k8s-recipe")
        try:
            ran = sb.commands.run("whoami; cat /opt/k8s/made; echo $RECIPE; "
                                  "stat -c %U /opt/k8s/made")
            assert ran.exit_code == 0, ran.stderr
            assert ran.stdout.split() == ["user", "from-recipe", "pushed", "user"]
        finally:
            sb.kill(delete_volume=True)
