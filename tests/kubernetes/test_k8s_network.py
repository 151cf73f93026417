"""Network policies on the cluster: every sandbox Pod has its NetworkPolicy from its first
moment, changed in one write; what a NetworkPolicy cannot express (host names) is
refused with a message that says what to give instead."""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox.core.errors import InvalidArgumentError

pytestmark = pytest.mark.integration


def _policy(cluster: Any, sandbox_id: str) -> dict[str, Any]:
    from kubernetes import client, config

    net = client.NetworkingV1Api(config.new_client_from_config(
        config_file=cluster.env["ABX_K8S_KUBECONFIG"]))
    found = net.read_namespaced_network_policy(f"abx-{sandbox_id}", cluster.namespace)
    return client.ApiClient().sanitize_for_serialization(found)


def test_policy_follows_the_sandbox_and_names_are_refused(
        k8s_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in k8s_cluster.env.items():
        monkeypatch.setenv(name, value)
    from agent_sandbox import Sandbox

    with pytest.raises(InvalidArgumentError, match="not names"):
        Sandbox.create(network=["pypi.org"])
    sb = Sandbox.create()
    try:
        made = _policy(k8s_cluster, sb.sandbox_id)
        assert made["spec"]["policyTypes"] == ["Ingress", "Egress"]
        assert made["spec"].get("egress", []) == []  # off: no egress at all
        owner = made["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("Secret", f"abx-{sb.sandbox_id}")
        sb.set_network(["203.0.113.0/24"])
        changed = _policy(k8s_cluster, sb.sandbox_id)
        assert changed["spec"]["egress"] == [{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}]
        assert changed["metadata"]["uid"] == made["metadata"]["uid"]  # replaced, not remade
        with pytest.raises(InvalidArgumentError, match="CIDRs"):
            sb.set_network("registries")
        assert sb.info().network.allow_out == ("203.0.113.0/24",)
    finally:
        sb.kill(delete_volume=True)
