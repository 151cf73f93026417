"""Smoke test of the test cluster through the PyPI `kubernetes` client (what the provider will use).

One busybox pod pinned to each Ready node; create -> Running timed per pod; each pod's HTTP server
fetched from this host by pod IP (how the provider reaches its guest); an exec (websocket) in one
pod; delete, waiting until they are gone. Repeats --rounds times; prints the p50
of create -> Running.
Usage: python scripts/k8s/smoke.py [--kubeconfig PATH] [--rounds N]
"""

import argparse
import statistics
import time
import urllib.request
import uuid

from kubernetes import client, config, watch
from kubernetes.stream import stream

NS = "default"
LABEL = "abx-smoke"
PORT = 8080
SERVE = f"hostname > /tmp/index.html; httpd -p {PORT} -h /tmp; echo booted; exec sleep 3600"


def pod(name: str, node: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={LABEL: "1"}),
        spec=client.V1PodSpec(
            node_name=node,
            restart_policy="Never",
            termination_grace_period_seconds=0,
            automount_service_account_token=False,
            containers=[
                client.V1Container(
                    name="sbx",
                    image="k8s.local/busybox:1.35",
                    image_pull_policy="Never",
                    command=["/bin/sh", "-c", SERVE],
                    resources=client.V1ResourceRequirements(
                        limits={"cpu": "100m", "memory": "64Mi"}
                    ),
                    security_context=client.V1SecurityContext(allow_privilege_escalation=False),
                )
            ],
        ),
    )


def one_round(v1: client.CoreV1Api, nodes: list[str]) -> list[float]:
    names = {f"smoke-{uuid.uuid4().hex[:6]}": node for node in nodes}
    created: dict[str, float] = {}
    for name, node in names.items():
        created[name] = time.monotonic()
        v1.create_namespaced_pod(NS, pod(name, node))
    running: dict[str, float] = {}
    w = watch.Watch()
    for ev in w.stream(v1.list_namespaced_pod, NS, label_selector=LABEL, timeout_seconds=120):
        p = ev["object"]
        name = p.metadata.name
        if name in names and p.status.phase == "Running" and name not in running:
            running[name] = time.monotonic() - created[name]
            print(
                f"  {name} on {p.spec.node_name} ({p.status.pod_ip}):"
                f" Running in {running[name]:.2f} s"
            )
        if p.status.phase == "Failed":
            raise SystemExit(f"pod {name} failed: {p.status}")
        if len(running) == len(names):
            w.stop()
    if len(running) != len(names):
        raise SystemExit(f"only {len(running)} of {len(names)} pods Running after 120 s")
    for name in names:
        ip = v1.read_namespaced_pod(name, NS).status.pod_ip
        url = f"http://{ip}:{PORT}/index.html"
        for _ in range(50):  # httpd may start just after the pod turns Running
            try:
                body = urllib.request.urlopen(url, timeout=2).read().decode().strip()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"{url} unreachable from this host")
        if body != name:
            raise SystemExit(f"{url} answered {body!r}, not {name!r}")
    print(f"  fetched each pod's page by pod IP from the host ({len(names)} ok)")
    first = next(iter(names))
    t = time.monotonic()
    out = stream(
        v1.connect_get_namespaced_pod_exec,
        first,
        NS,
        command=["/bin/sh", "-c", "echo hi > /tmp/x; cat /tmp/x; hostname; id -u"],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    print(f"  exec in {first}: {out.split()} in {time.monotonic() - t:.3f} s")
    print(f"  logs of {first}: {v1.read_namespaced_pod_log(first, NS).strip()!r}")
    t = time.monotonic()
    for name in names:
        v1.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    while v1.list_namespaced_pod(NS, label_selector=LABEL).items:
        time.sleep(0.2)
    print(f"  deleted {len(names)} pods, gone in {time.monotonic() - t:.2f} s")
    return list(running.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", default="/var/lib/abx-k8s/kubeconfig")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    config.load_kube_config(a.kubeconfig)
    v1 = client.CoreV1Api()
    nodes = sorted(
        n.metadata.name
        for n in v1.list_node().items
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
    )
    print("Ready nodes:", nodes)
    samples: list[float] = []
    for r in range(a.rounds):
        print(f"round {r + 1}")
        samples += one_round(v1, nodes)
    print(
        f"create->Running over {len(samples)} pods: p50 {statistics.median(samples):.2f} s, "
        f"min {min(samples):.2f} s, max {max(samples):.2f} s"
    )


if __name__ == "__main__":
    main()
