"""The Kubernetes provider on the test cluster (scripts/k8s_cluster.sh up) next to the
embedded engine on this host: create (cold, and claimed from the warm pool), and the
exec round trip (`true`); medians over N runs, same machine, same run.

Run by hand, as root, with the test cluster up:
``.venv/bin/python bench/k8s_cluster.py [--n 5] [--rounds 50]`` (not ``kubernetes.py``:
the script's directory comes first on ``sys.path`` and would hide the ``kubernetes``
client). It uses its own namespaces (``abx-bench``, ``abx-bench-pool``), pushes ``base``
into them the first time, and removes every sandbox it made.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ms, fmt_ratio, median, progress, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KUBECONFIG = "/var/lib/abx-k8s/kubeconfig"
# Targets of our own (the issue names none): a warm create answers like a local cold one,
# an exec is a few milliseconds over the pod network.
TARGET_WARM_S = 0.5
TARGET_EXEC_MS = 10.0


def _env(namespace: str, pool: int) -> dict[str, str]:
    return {"ABX_ENGINE": "kubernetes", "ABX_K8S_KUBECONFIG": KUBECONFIG,
            "ABX_K8S_NAMESPACE": namespace,
            "ABX_K8S_HOSTPATH_DIR": f"/var/lib/abx-k8s-bench-volumes/{namespace}",
            "ABX_K8S_IMAGE_PULL_POLICY": "Never", "ABX_POOL_SIZE": str(pool),
            "ABX_POOL_TEMPLATES": "base"}


def _prepare(namespace: str) -> None:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(config.new_client_from_config(config_file=KUBECONFIG))
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    try:
        core.read_namespaced_config_map("abx-templates", namespace)
        return
    except ApiException:
        pass
    progress(f"pushing base into {namespace} (once)")
    subprocess.run([sys.executable, "-m", "agent_sandbox.surfaces.cli.main", "template", "push",
                    "base", "--load-lab"], env={**os.environ, **_env(namespace, 0)},
                   check=True, cwd=ROOT)


def _provider(namespace: str, pool: int) -> Any:
    from agent_sandbox.config.settings import Settings
    from agent_sandbox.providers.kubernetes import kubernetes_service

    return kubernetes_service(Settings(**_env(namespace, pool)))


def _creates(provider: Any, n: int, before: Callable[[], None] = lambda: None
             ) -> list[float]:
    times = []
    for _ in range(n):
        before()
        started = time.perf_counter()
        info = provider.create(template="base")
        times.append(time.perf_counter() - started)
        provider.kill(info.sandbox_id, delete_volume=True)
    return times


def _execs(provider: Any, rounds: int) -> list[float]:
    sid = provider.create(template="base").sandbox_id
    try:
        provider.run(sid, "true")
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            provider.run(sid, "true")
            times.append(time.perf_counter() - started)
        return times
    finally:
        provider.kill(sid, delete_volume=True)


def _wait_pool(provider: Any, size: int) -> None:
    deadline = time.monotonic() + 120
    while len(provider.backend.supervisor.pool.pooled("base")) < size:
        if time.monotonic() > deadline:
            raise SystemExit("the warm pool did not fill in 120 s")
        provider.reap_once()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=5, help="creates per kind")
    parser.add_argument("--rounds", type=int, default=50, help="exec round trips")
    args = parser.parse_args()
    os.environ.setdefault("ABX_POOL_SIZE", "0")
    for ns in ("abx-bench", "abx-bench-pool"):
        _prepare(ns)

    progress(f"cluster: {args.n} cold creates, {args.rounds} execs")
    cold = _provider("abx-bench", 0)
    cold_times = _creates(cold, args.n)
    cluster_exec = _execs(cold, args.rounds)

    progress(f"cluster: {args.n} creates from a warm pool of 2")
    warm = _provider("abx-bench-pool", 2)
    warm_times = _creates(warm, args.n, before=lambda: _wait_pool(warm, 1))
    warm.drain_pool()
    warm.close()
    cold.close()

    progress(f"embedded engine: {args.n} cold creates, {args.rounds} execs")
    from agent_sandbox.providers.local import local_provider

    local = local_provider()
    local_times = _creates(local, args.n)
    local_exec = _execs(local, args.rounds)

    rows = [
        ["create, cold", fmt_ms(median(cold_times) * 1e3), fmt_ms(median(local_times) * 1e3),
         fmt_ratio(median(cold_times) / median(local_times)), "-"],
        ["create, warm pool", fmt_ms(median(warm_times) * 1e3), "-", "-",
         f"<= {TARGET_WARM_S * 1e3:.0f} ms"],
        ["exec `true`", fmt_ms(median(cluster_exec) * 1e3), fmt_ms(median(local_exec) * 1e3),
         fmt_ratio(median(cluster_exec) / median(local_exec)), f"<= {TARGET_EXEC_MS:.0f} ms"],
    ]
    print(table(["what (median)", "kubernetes", "embedded", "ratio", "target"], rows,
                title="Kubernetes provider (3-node test cluster) vs the embedded engine"))


if __name__ == "__main__":
    main()
